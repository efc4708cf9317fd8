-- pgbench script: one call of Tollgate's SQL function per transaction
-- (sql/functions/take_tokens.sql: 1 token/s, burst 10, as the article's
-- call with refill_per_sec 1 and window_seconds 10), keys drawn as in
-- check_seed.sql. Run under SERIALIZABLE with retries, as its header
-- advises:
--   PGOPTIONS='-c default_transaction_isolation=serializable' \
--   pgbench -n -M prepared --max-tries=100 -D keys=1000000 -D hot_keys=1000 \
--           -D hot_percent=90 -f check_ours.sql …
\set r random(1, 100)
\if :r <= :hot_percent
\set key random(0, :hot_keys - 1)
\else
\set key random(0, :keys - 1)
\endif
SELECT * FROM tollgate_take_tokens('per-key', 'key-' || :key, 1, 1, 10);
