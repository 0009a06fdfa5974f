//! The decision row per (event, thread version): the statements are the
//! store's ([`threadline_store::decisions`]).

pub use threadline_store::decisions::{
    Binding, Claim, ClaimFound, ClaimOutcome, ClaimRequest, Settle, Settled, claim, claim_many,
    settle, settle_many,
};
