-- Tollgate's PostgreSQL schema, version 2: exact consumption totals.
--
-- Request units and CPU time were kept as FLOAT8 sums, which drop small
-- reports once a total is large (at 1e16 a report of 1 unit vanished) and
-- round sums of fractions (2000 x 0.1 gave 199.99999999999292). Operators
-- bill from these totals, so they become integers of micro-units
-- (millionths), summed exactly like the other counters. Every total
-- saturates at the BIGINT range: the server saturates before it writes, so
-- no report can make a write fail.
--
-- Existing totals are converted through NUMERIC (exact), rounded to the
-- nearest micro-unit and kept within the BIGINT range.

ALTER TABLE tenant_usage RENAME COLUMN total_request_units TO total_request_unit_micros;
ALTER TABLE tenant_usage ALTER COLUMN total_request_unit_micros TYPE BIGINT
    USING LEAST(GREATEST(round(total_request_unit_micros::NUMERIC * 1000000), 0),
                9223372036854775807)::BIGINT;

ALTER TABLE tenant_usage RENAME COLUMN total_cpu_seconds TO total_cpu_micros;
ALTER TABLE tenant_usage ALTER COLUMN total_cpu_micros TYPE BIGINT
    USING LEAST(GREATEST(round(total_cpu_micros::NUMERIC * 1000000), 0),
                9223372036854775807)::BIGINT;
