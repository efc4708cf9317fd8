-- Tollgate's PostgreSQL schema, version 15: the initial allowance said
-- with an instance's last grant.
--
-- Every answer tells the pod what a new pod of its bucket may use before
-- its first answer (the burst split between the live pods). A repeated
-- request must get the answer the first got, so the instance row keeps it
-- with the rest of its last grant. Existing rows have it NULL: a repeat
-- answered from such a grant does not say.

ALTER TABLE tenant_usage
    ADD COLUMN IF NOT EXISTS last_grant_initial_allowance FLOAT8;
