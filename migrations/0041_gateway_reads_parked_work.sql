-- The gateway sheds an installation's new questions while many of its
-- requests wait parked for their turn (`budgets::parked_for_turn_at_least`,
-- THREADLINE_SHED_PARKED): it counts them by installation, and reads
-- nothing else of the line.
GRANT SELECT (installation_id, state, reason) ON tenant_work TO threadline_gateway;
