//! Test fixtures and reads for the `intents` family (see `crate::intents`).
