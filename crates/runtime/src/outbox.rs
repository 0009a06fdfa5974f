//! The alert for an answer crossed in flight (the outbox itself is
//! `threadline_store::outbox`).

/// Counts an answer crossed in flight (`threadline_crossed_in_flight_total`,
/// by the service that saw it) with an alert line.
pub fn crossed_in_flight(messages: usize, by: &'static str) {
    metrics::counter!("threadline_crossed_in_flight_total", "detected_by" => by).increment(1);
    tracing::warn!(
        alert = "crossed_in_flight",
        crossing_messages = messages,
        detected_by = by,
        "a human message reached the thread while its answer was in flight; the thread is reconsidered"
    );
}
