-- Every tier, for an export, in byte order of their names (as the
-- embedded store keeps them, whatever the database's collation).
SELECT name, definition FROM tollgate_tiers ORDER BY name COLLATE "C"
