-- Every tier.
SELECT name, definition FROM tollgate_tiers ORDER BY name
