//! Reads of the server itself rather than of a table: scratch databases, sessions, locks, and pg_stat_statements for the benches.
