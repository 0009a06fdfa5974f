//! Reply intents and the checks around a post: the statements are the
//! store's ([`threadline_store::intents`]); the publisher drives them.

pub use threadline_store::intents::*;
