//! Test fixtures and reads for the `channels` family (see `crate::channels`).
