-- The baseline for the per-key benchmark: the token bucket per user of
-- Franck Pachot's article "Rate limiting with a SQL token bucket"
-- (YugabyteDB blog), as published: one integer token taken per call,
-- refill from clock_timestamp(), a row per user, SERIALIZABLE for
-- atomicity. It is here to be measured against, not to be used: it
-- truncates fractional refill and resets `ts` on every call, so a caller
-- polling a dry key keeps it dry (see sql/functions/take_tokens.sql for
-- the function Tollgate ships).
CREATE TABLE IF NOT EXISTS rate_limiting_token_bucket (
    id TEXT PRIMARY KEY,
    tk BIGINT NOT NULL,
    ts TIMESTAMPTZ NOT NULL
);

CREATE OR REPLACE FUNCTION rate_limiting_token_bucket_request(
    rate_id TEXT, refill_per_sec INT DEFAULT 2, window_seconds INT DEFAULT 60
) RETURNS INT AS $$
DECLARE
    new_tk INT := NULL;
BEGIN
    UPDATE rate_limiting_token_bucket
    SET ts = now(),
        tk = greatest(least(
            tk - 1 + refill_per_sec * extract(epoch FROM clock_timestamp() - ts),
            window_seconds * refill_per_sec), -1)
    WHERE rate_limiting_token_bucket.id = rate_id
    RETURNING tk INTO new_tk;
    IF new_tk IS NULL THEN
        INSERT INTO rate_limiting_token_bucket (id, tk, ts)
        VALUES (rate_id, window_seconds * refill_per_sec - 1, clock_timestamp())
        RETURNING tk INTO new_tk;
    END IF;
    RETURN new_tk;
END; $$ LANGUAGE plpgsql;
