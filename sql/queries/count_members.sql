-- How many members organisation $1 has.
SELECT count(*) AS members FROM tollgate_organisation_nodes WHERE member_of = $1
