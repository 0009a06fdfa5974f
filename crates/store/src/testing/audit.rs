//! Test fixtures and reads for the `audit` family (see `crate::audit`).
