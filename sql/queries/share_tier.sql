-- Reads tier $1 and holds it against deletion and replacement until the
-- transaction ends (a tenant change that puts a tenant on it).
SELECT definition FROM tollgate_tiers WHERE name = $1 FOR SHARE
