-- The store's clock, read after the head rows are locked, so that the
-- transactions of a tenant see time move forward in the order they run.
SELECT clock_timestamp() AS now
