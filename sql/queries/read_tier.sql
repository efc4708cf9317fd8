-- Tier $1's definition.
SELECT definition FROM tollgate_tiers WHERE name = $1
