//! Test fixtures and reads for the `kill_switches` family (see `crate::kill_switches`).
