-- Tollgate's PostgreSQL schema, version 14: room on tenant_usage's pages.
--
-- A head row is rewritten by every transaction of its bucket. PostgreSQL
-- can keep the new version on the same page, without touching the
-- primary key's index (a HOT update), only while that page has free
-- space; a full page is pruned first, on the hot path. Leaving 30 % of
-- each page free when rows are inserted keeps most updates HOT and
-- prunes less often. Applies to pages written from now on; existing
-- pages gain the room as they are rewritten (VACUUM FULL or a restore).

ALTER TABLE tenant_usage SET (fillfactor = 70);
