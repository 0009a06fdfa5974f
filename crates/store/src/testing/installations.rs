//! Test fixtures and reads for the `installations` family (see `crate::installations`).
