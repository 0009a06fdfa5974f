//! Bus contracts, generated from `proto/threadline/v1/*.proto` at build time.

/// Version 1 of the contracts. `SCHEMA_VERSION` is what producers set in each
/// message's `schema_version`.
#[allow(clippy::doc_markdown, clippy::derive_partial_eq_without_eq)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/threadline.v1.rs"));

    pub const SCHEMA_VERSION: u32 = 1;
}

pub use prost::Message;

#[cfg(test)]
mod tests {
    use super::Message;
    use super::v1::EventAccepted;

    #[test]
    fn event_accepted_round_trips_and_tolerates_unknown_fields() {
        let m = EventAccepted {
            schema_version: super::v1::SCHEMA_VERSION,
            event_id: "Ev1".into(),
            event_json: br#"{"type":"message"}"#.to_vec(),
            ..Default::default()
        };
        let mut bytes = m.encode_to_vec();
        assert_eq!(EventAccepted::decode(bytes.as_slice()).expect("decodes"), m);
        // A newer producer's field 99 (varint 7) must not break an older consumer.
        bytes.extend_from_slice(&[0x98, 0x06, 0x07]);
        assert_eq!(
            EventAccepted::decode(bytes.as_slice()).expect("decodes with unknown field"),
            m
        );
    }
}
