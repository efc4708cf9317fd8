-- Tollgate's PostgreSQL schema, version 17: what the pods said they hold.
--
-- The parts a pod may take at once count what the other pods hold as used
-- at twice their shares (their shares lag their use while demand climbs),
-- the burst cap at their shares. Both follow from the head row's count
-- (`held_tokens`, as of its last refill) and the sum of what the holding
-- instances reported, none of it used: `held_reported`, the sum of the
-- instance rows' `held_tokens`, computed here for existing buckets.

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS held_reported FLOAT8 NOT NULL DEFAULT 0;

UPDATE tenant_usage AS head
SET held_reported = (
    SELECT COALESCE(SUM(pod.held_tokens), 0)
    FROM tenant_usage AS pod
    WHERE pod.tenant_id = head.tenant_id
      AND pod.bucket = head.bucket
      AND pod.instance_id > 0
)
WHERE head.instance_id = 0;
