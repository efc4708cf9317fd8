-- Rows of the tree of organisations, for an import: ($1[i], $2[i], $3[i],
-- $4[i]) as upsert_node.sql's parameters.
INSERT INTO tollgate_organisation_nodes (tenant_id, is_organisation, member_of, node)
SELECT * FROM unnest($1::TEXT[], $2::BOOL[], $3::TEXT[], $4::TEXT[])
