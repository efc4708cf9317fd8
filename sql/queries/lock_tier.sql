-- Locks and reads tier $1 (to replace or delete it).
SELECT definition FROM tollgate_tiers WHERE name = $1 FOR UPDATE
