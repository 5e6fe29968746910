//! The Pusher HTTP API's counters: requests by outcome, so refused signatures, stale clocks and
//! malformed bodies show on a dashboard (`clarion_pusher_api_requests_total{outcome}`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a Pusher API request came to: answered, or refused for one of these reasons (the
/// signature's reasons are `clarion_proto::pusher::signed_request::RequestError::label`s, the
/// bodies' `TriggerError::label`s are counted as `body`).
pub const PUSHER_API_OUTCOMES: [&str; 13] = [
    "ok",
    "unknown_app",
    "not_found",
    "query",
    "missing",
    "key",
    "version",
    "timestamp",
    "body_md5",
    "signature",
    "body",
    "channel",
    "unavailable",
];

/// What happened on Pusher WebSockets (`/app/{key}`): connections accepted or refused (with
/// the Pusher error code's reason), and client messages refused, by reason (the decoder's are
/// `clarion_proto::pusher::client::ClientError::label`s).
pub const PUSHER_WS_OUTCOMES: [&str; 23] = [
    "connected",
    "unknown_app",
    "protocol",
    "over_quota",
    "too_large",
    "too_deep",
    "malformed",
    "field",
    "channel",
    "unknown_event",
    "event_name",
    "binary",
    "auth",
    "channel_data",
    "subscriptions",
    "client_events_off",
    "client_event_channel",
    "client_event_rate",
    "client_event_size",
    "signin",
    "terminated",
    "resume",
    "handover_app_gone",
];

/// Pusher API counters.
#[derive(Debug, Default)]
pub struct PusherCounters {
    api: [AtomicU64; PUSHER_API_OUTCOMES.len()],
    ws: [AtomicU64; PUSHER_WS_OUTCOMES.len()],
}

impl PusherCounters {
    /// Counts one request with its outcome (one of [`PUSHER_API_OUTCOMES`]; another is not
    /// counted, which the tests rule out).
    pub fn api(&self, outcome: &str) {
        if let Some(c) = PUSHER_API_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .and_then(|i| self.api.get(i))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Counts one Pusher WebSocket event (one of [`PUSHER_WS_OUTCOMES`]).
    pub fn ws(&self, outcome: &str) {
        if let Some(c) = PUSHER_WS_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .and_then(|i| self.ws.get(i))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Pusher WebSocket events counted with `outcome`.
    pub fn ws_count(&self, outcome: &str) -> u64 {
        PUSHER_WS_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .and_then(|i| self.ws.get(i))
            .map_or(0, |c| c.load(Relaxed))
    }

    /// Requests counted with `outcome`.
    pub fn api_count(&self, outcome: &str) -> u64 {
        PUSHER_API_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .and_then(|i| self.api.get(i))
            .map_or(0, |c| c.load(Relaxed))
    }

    /// The family, in Prometheus' text format.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP clarion_pusher_api_requests_total Pusher HTTP API requests, by outcome.\n\
             # TYPE clarion_pusher_api_requests_total counter"
        );
        for (name, c) in PUSHER_API_OUTCOMES.iter().zip(&self.api) {
            let _ = writeln!(
                out,
                "clarion_pusher_api_requests_total{{outcome=\"{name}\"}} {}",
                c.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP clarion_pusher_ws_total Pusher WebSocket connections and client messages, by outcome.\n\
             # TYPE clarion_pusher_ws_total counter"
        );
        for (name, c) in PUSHER_WS_OUTCOMES.iter().zip(&self.ws) {
            let _ = writeln!(
                out,
                "clarion_pusher_ws_total{{outcome=\"{name}\"}} {}",
                c.load(Relaxed)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clarion_proto::pusher::signed_request::RequestError;

    #[test]
    fn every_signature_refusal_has_an_outcome_label() {
        let errors = [
            RequestError::BadQuery,
            RequestError::TooManyParams,
            RequestError::Repeated("a".into()),
            RequestError::Missing("auth_key"),
            RequestError::WrongKey,
            RequestError::BadVersion,
            RequestError::BadTimestamp,
            RequestError::Stale { given: 0, now: 0 },
            RequestError::MissingBodyMd5,
            RequestError::BodyMd5Mismatch,
            RequestError::BadSignature(String::new()),
        ];
        let c = PusherCounters::default();
        for e in errors {
            assert!(PUSHER_API_OUTCOMES.contains(&e.label()), "{e:?}");
            c.api(e.label());
        }
        assert_eq!(c.api_count("timestamp"), 2);
        let mut text = String::new();
        c.render(&mut text);
        assert!(text.contains("clarion_pusher_api_requests_total{outcome=\"signature\"} 1"));
    }
}
