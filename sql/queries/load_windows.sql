-- The instance rows each request of a batch needs, in one statement
-- whatever the batch's size. Request i (1-based, returned as `request`)
-- reads bucket ($1[i], $2[i]): the four runs of ids of its window
-- (tollgate_core::global_bucket::instance_window), each as (first id,
-- last id, row limit): its own row ($3-$5[i]), its predecessor (the
-- highest id in $6[i]..$7[i], descending), and the rows that follow it
-- ($9-$11[i]) and wrap past the highest id ($12-$14[i]). A row may come
-- twice for a request; the caller keeps one.
SELECT r.request, u.*
FROM unnest(
    $1::TEXT[], $2::TEXT[],
    $3::BIGINT[], $4::BIGINT[], $5::BIGINT[],
    $6::BIGINT[], $7::BIGINT[], $8::BIGINT[],
    $9::BIGINT[], $10::BIGINT[], $11::BIGINT[],
    $12::BIGINT[], $13::BIGINT[], $14::BIGINT[]
) WITH ORDINALITY AS r(
    tenant_id, bucket,
    own_first, own_last, own_limit,
    before_first, before_last, before_limit,
    after_first, after_last, after_limit,
    wrap_first, wrap_last, wrap_limit,
    request
)
CROSS JOIN LATERAL (
    (SELECT * FROM tenant_usage t WHERE t.tenant_id = r.tenant_id AND t.bucket = r.bucket
       AND t.instance_id BETWEEN r.own_first AND r.own_last
     ORDER BY t.instance_id LIMIT r.own_limit)
    UNION ALL
    (SELECT * FROM tenant_usage t WHERE t.tenant_id = r.tenant_id AND t.bucket = r.bucket
       AND t.instance_id BETWEEN r.before_first AND r.before_last
     ORDER BY t.instance_id DESC LIMIT r.before_limit)
    UNION ALL
    (SELECT * FROM tenant_usage t WHERE t.tenant_id = r.tenant_id AND t.bucket = r.bucket
       AND t.instance_id BETWEEN r.after_first AND r.after_last
     ORDER BY t.instance_id LIMIT r.after_limit)
    UNION ALL
    (SELECT * FROM tenant_usage t WHERE t.tenant_id = r.tenant_id AND t.bucket = r.bucket
       AND t.instance_id BETWEEN r.wrap_first AND r.wrap_last
     ORDER BY t.instance_id LIMIT r.wrap_limit)
) AS u
