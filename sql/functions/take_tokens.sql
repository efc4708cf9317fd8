-- tollgate_take_tokens: a token bucket per key, taken inside your own
-- transaction. Install into PostgreSQL with
--     psql -f sql/functions/take_tokens.sql "$DATABASE_URL"
-- (it is independent of Tollgate's own schema and may live in any
-- database). It is the YugabyteDB article's approach, with the flaws that
-- made it under-count fixed:
--   - tokens are FLOAT8, so a fraction of a second's refill is kept, not
--     truncated away at every call;
--   - the refill clock moves only by the time it has refilled for, and a
--     refused call leaves the key as it was (the article's version reset
--     `ts` on every call, so a caller polling a throttled key kept it
--     empty);
--   - a call may take several tokens, refill is capped at the burst, a key
--     never seen starts full, and the database clock (clock_timestamp(),
--     read after the row is locked) is the only clock;
--   - a key back at its burst needs no row, so its row is deleted and the
--     table holds only keys below their burst.
--
-- SELECT * FROM tollgate_take_tokens(bucket, key, tokens, refill_rate, burst_limit)
--   → allowed, remaining, retry_after_seconds (NULL: never),
--     reset_after_seconds (NULL: never), taken_at (the database time the
--     call counted from)
--
-- Concurrency: the key's row is locked (SELECT ... FOR UPDATE) before it is
-- read, and a key's first row is created with INSERT ... ON CONFLICT DO
-- NOTHING. Under READ COMMITTED the calls on one key queue on that lock,
-- two first calls on a key without a row too (the second waits for the
-- first to commit, then runs on the row it made): they never fail. Under
-- SERIALIZABLE (YugabyteDB's and CockroachDB's default, PostgreSQL's when
-- asked) two calls on the same key conflict and one fails with SQLSTATE
-- 40001 (serialization_failure), or 40P01 (deadlock_detected) when your
-- transaction also locks other rows: roll back and run the whole
-- transaction again, with a short random backoff. Nothing was taken by
-- the failed attempt. Bad arguments raise SQLSTATE 22023
-- (invalid_parameter_value) naming the argument.

CREATE TABLE IF NOT EXISTS tollgate_key_tokens (
    bucket      TEXT NOT NULL,
    key         TEXT NOT NULL,
    -- Tokens as of last_refill; below the bucket's burst (a full key has
    -- no row).
    tokens      FLOAT8 NOT NULL,
    last_refill TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (bucket, key)
);

CREATE OR REPLACE FUNCTION tollgate_take_tokens(
    p_bucket      TEXT,
    p_key         TEXT,
    p_tokens      FLOAT8,
    p_refill_rate FLOAT8,
    p_burst_limit FLOAT8
) RETURNS TABLE (
    allowed             BOOLEAN,
    remaining           FLOAT8,
    retry_after_seconds FLOAT8,
    reset_after_seconds FLOAT8,
    taken_at            TIMESTAMPTZ
) LANGUAGE plpgsql AS $$
DECLARE
    v_tokens FLOAT8;
    v_last   TIMESTAMPTZ;
    v_now    TIMESTAMPTZ;
    v_level  FLOAT8;
    v_found  BOOLEAN;
BEGIN
    IF p_bucket IS NULL OR p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'p_key: must not be empty (p_bucket must not be NULL)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tokens IS NULL OR p_tokens = 'NaN'::FLOAT8 OR p_tokens < 0 OR p_tokens = 'Infinity'::FLOAT8 THEN
        RAISE EXCEPTION 'p_tokens: must be finite and >= 0, got %', p_tokens
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_refill_rate IS NULL OR p_refill_rate = 'NaN'::FLOAT8 OR p_refill_rate < 0 OR p_refill_rate = 'Infinity'::FLOAT8 THEN
        RAISE EXCEPTION 'p_refill_rate: must be finite and >= 0, got %', p_refill_rate
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_burst_limit IS NULL OR p_burst_limit = 'NaN'::FLOAT8 OR p_burst_limit < 0 OR p_burst_limit = 'Infinity'::FLOAT8 THEN
        RAISE EXCEPTION 'p_burst_limit: must be finite and >= 0, got %', p_burst_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Lock the key's row and compute the call; a key with no row is full.
    -- A first call that leaves the key below its burst creates the row,
    -- and a concurrent first call may have created it since this one
    -- looked (the SELECT finds no row to wait on): the INSERT then waits
    -- for that transaction, does nothing once it has committed, and the
    -- call starts over on the row it made, so under READ COMMITTED it
    -- queues like any other call instead of failing with 23505. Under
    -- SERIALIZABLE the same INSERT fails with 40001 (the row is not in the
    -- transaction's snapshot), so no token is taken twice.
    LOOP
        SELECT t.tokens, t.last_refill INTO v_tokens, v_last
        FROM tollgate_key_tokens t
        WHERE t.bucket = p_bucket AND t.key = p_key
        FOR UPDATE;
        v_found := FOUND;
        -- Read after the lock: calls on a key see time move forward in
        -- the order they run.
        v_now := clock_timestamp();

        IF NOT v_found THEN
            v_level := p_burst_limit;
        ELSE
            v_level := LEAST(p_burst_limit,
                v_tokens + p_refill_rate * GREATEST(0, EXTRACT(EPOCH FROM v_now - v_last)));
            v_now := GREATEST(v_now, v_last);
        END IF;

        allowed := p_tokens <= v_level;
        IF allowed THEN
            v_level := v_level - p_tokens;
        END IF;
        -- A refused call, or one that leaves the key full, writes no row.
        EXIT WHEN v_found OR v_level >= p_burst_limit;
        INSERT INTO tollgate_key_tokens (bucket, key, tokens, last_refill)
        VALUES (p_bucket, p_key, v_level, v_now)
        ON CONFLICT (bucket, key) DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;

    IF v_found THEN
        IF v_level >= p_burst_limit THEN
            -- Full: no row needed.
            DELETE FROM tollgate_key_tokens t WHERE t.bucket = p_bucket AND t.key = p_key;
        ELSIF allowed THEN
            UPDATE tollgate_key_tokens t SET tokens = v_level, last_refill = v_now
            WHERE t.bucket = p_bucket AND t.key = p_key;
        END IF;
    END IF;
    -- A refused call below the burst changes nothing: the key keeps
    -- refilling from where it was.

    remaining := v_level;
    taken_at := v_now;
    retry_after_seconds := CASE
        WHEN allowed THEN 0
        WHEN p_tokens > p_burst_limit OR p_refill_rate = 0 THEN NULL
        ELSE (p_tokens - v_level) / p_refill_rate
    END;
    reset_after_seconds := CASE
        WHEN v_level >= p_burst_limit THEN 0
        WHEN p_refill_rate = 0 THEN NULL
        ELSE (p_burst_limit - v_level) / p_refill_rate
    END;
    RETURN NEXT;
END;
$$;
