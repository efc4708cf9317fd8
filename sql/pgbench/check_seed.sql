-- pgbench script: one call of the article's function per transaction
-- (sql/pgbench/seed_function.sql), keys drawn as `tollgate bench --checks`
-- draws them: a :hot_percent % of calls on the first :hot_keys keys, the
-- rest uniform over :keys. Run under SERIALIZABLE with retries:
--   PGOPTIONS='-c default_transaction_isolation=serializable' \
--   pgbench -n -M prepared --max-tries=100 -D keys=1000000 -D hot_keys=1000 \
--           -D hot_percent=90 -f check_seed.sql …
\set r random(1, 100)
\if :r <= :hot_percent
\set key random(0, :hot_keys - 1)
\else
\set key random(0, :keys - 1)
\endif
SELECT rate_limiting_token_bucket_request('key-' || :key, 1, 10);
