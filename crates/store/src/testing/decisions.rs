//! Test fixtures and reads for the `decisions` family (see `crate::decisions`).
