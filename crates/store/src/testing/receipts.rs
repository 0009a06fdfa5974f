//! Test fixtures and reads for the `receipts` family (see `crate::receipts`).
