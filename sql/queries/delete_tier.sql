-- Deletes tier $1 (locked by lock_tier.sql, no tenant on it).
DELETE FROM tollgate_tiers WHERE name = $1
