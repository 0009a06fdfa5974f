//! Test fixtures and reads for the `threads` family (see `crate::threads`).
