-- Writes tier $1's definition $2.
INSERT INTO tollgate_tiers (name, definition) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET definition = excluded.definition
