//! The decision row per (event, thread version): the statements are the
//! store's ([`threadline_store::decisions`]).

pub use threadline_store::decisions::{Binding, Claim, Settled, claim, settle};
