//! Test fixtures and reads for the `outbox` family (see `crate::outbox`).
