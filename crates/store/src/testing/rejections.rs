//! Test fixtures and reads for the `rejections` family (see `crate::rejections`).
