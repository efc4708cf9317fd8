-- How many keys are below their burst and how many check records are
-- kept, exactly, from one snapshot.
SELECT (SELECT count(*) FROM tollgate_keys) AS keys,
       (SELECT count(*) FROM tollgate_check_requests) AS records
