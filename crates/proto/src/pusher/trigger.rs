//! The bodies of the HTTP API's triggers: `POST /apps/{id}/events` (one event on one or many
//! channels) and `POST /apps/{id}/batch_events` (several events, each on one channel), decoded
//! and checked against the application's limits before anything is published (all or nothing).

use serde::Deserialize;

use super::channel::{classify, ChannelError};
use super::json_depth;
use super::socket_id;
use super::Limits;

/// One event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    /// The event name.
    pub name: String,
    /// The channels (valid, each once).
    pub channels: Vec<String>,
    /// Pusher's `data`: a string, relayed as it is.
    pub data: String,
    /// The connection not to send it to (`socket_id`), checked for shape.
    pub socket_id: Option<String>,
    /// Attributes asked for in the answer (`info`), as given.
    pub info: Option<String>,
}

/// Why a trigger body was refused, with its HTTP status ([`TriggerError::status`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TriggerError {
    /// Not the JSON the endpoint takes (or nested past the limit).
    #[error("invalid JSON body: {0}")]
    Malformed(String),
    /// No `name`, or one longer than the limit.
    #[error("event name must be 1 to {0} characters")]
    Name(usize),
    /// Neither `channel` nor `channels`, or more channels than the limit.
    #[error("1 to {0} channels per event")]
    ChannelCount(usize),
    /// A channel name is invalid.
    #[error("invalid channel name {name:?}: {why}")]
    Channel {
        /// The name.
        name: String,
        /// What is wrong with it.
        why: ChannelError,
    },
    /// `data` is larger than the limit (`413`).
    #[error("event data larger than {0} bytes")]
    DataTooLarge(usize),
    /// `socket_id` is not `DIGITS.DIGITS`.
    #[error("invalid socket_id")]
    SocketId,
    /// An empty batch, or more events than the limit.
    #[error("a batch holds 1 to {0} events")]
    BatchSize(usize),
}

impl TriggerError {
    /// The HTTP status Pusher answers it with.
    pub fn status(&self) -> u16 {
        match self {
            TriggerError::DataTooLarge(_) => 413,
            TriggerError::Malformed(_)
            | TriggerError::Name(_)
            | TriggerError::ChannelCount(_)
            | TriggerError::Channel { .. }
            | TriggerError::SocketId
            | TriggerError::BatchSize(_) => 400,
        }
    }

    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            TriggerError::Malformed(_) => "malformed",
            TriggerError::Name(_) => "name",
            TriggerError::ChannelCount(_) => "channels",
            TriggerError::Channel { .. } => "channel",
            TriggerError::DataTooLarge(_) => "data_size",
            TriggerError::SocketId => "socket_id",
            TriggerError::BatchSize(_) => "batch_size",
        }
    }
}

#[derive(Deserialize)]
struct RawEvent {
    name: Option<String>,
    data: Option<String>,
    channel: Option<String>,
    channels: Option<Vec<String>>,
    socket_id: Option<String>,
    info: Option<String>,
}

#[derive(Deserialize)]
struct RawBatch {
    batch: Vec<RawEvent>,
}

/// Decodes `POST /apps/{id}/events`.
pub fn decode_event(body: &[u8], limits: &Limits) -> Result<Trigger, TriggerError> {
    bounded(body, limits)?;
    let raw: RawEvent =
        serde_json::from_slice(body).map_err(|e| TriggerError::Malformed(e.to_string()))?;
    check(raw, limits)
}

/// Decodes `POST /apps/{id}/batch_events`: each event on its one channel.
pub fn decode_batch(body: &[u8], limits: &Limits) -> Result<Vec<Trigger>, TriggerError> {
    bounded(body, limits)?;
    let raw: RawBatch =
        serde_json::from_slice(body).map_err(|e| TriggerError::Malformed(e.to_string()))?;
    if raw.batch.is_empty() || raw.batch.len() > limits.max_batch {
        return Err(TriggerError::BatchSize(limits.max_batch));
    }
    raw.batch
        .into_iter()
        .map(|e| {
            // A batch item names one channel (`channel`).
            if e.channels.is_some() {
                return Err(TriggerError::ChannelCount(1));
            }
            check(e, limits)
        })
        .collect()
}

fn bounded(body: &[u8], limits: &Limits) -> Result<(), TriggerError> {
    if json_depth::within(body, limits.max_depth) {
        Ok(())
    } else {
        Err(TriggerError::Malformed(format!(
            "nested deeper than {} levels",
            limits.max_depth
        )))
    }
}

fn check(raw: RawEvent, limits: &Limits) -> Result<Trigger, TriggerError> {
    let name = raw.name.unwrap_or_default();
    if name.is_empty() || name.len() > limits.max_event_name {
        return Err(TriggerError::Name(limits.max_event_name));
    }
    let mut channels = match (raw.channel, raw.channels) {
        (Some(c), None) => vec![c],
        (None, Some(cs)) => cs,
        (Some(_), Some(_)) | (None, None) => {
            return Err(TriggerError::ChannelCount(limits.max_trigger_channels))
        }
    };
    if channels.is_empty() || channels.len() > limits.max_trigger_channels {
        return Err(TriggerError::ChannelCount(limits.max_trigger_channels));
    }
    for c in &channels {
        classify(c).map_err(|why| TriggerError::Channel {
            name: c.clone(),
            why,
        })?;
    }
    channels.sort();
    channels.dedup();
    let data = raw.data.unwrap_or_default();
    if data.len() > limits.max_event_data {
        return Err(TriggerError::DataTooLarge(limits.max_event_data));
    }
    if let Some(s) = &raw.socket_id {
        socket_id::validate(s).map_err(|_| TriggerError::SocketId)?;
    }
    Ok(Trigger {
        name,
        channels,
        data,
        socket_id: raw.socket_id,
        info: raw.info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(body: &str) -> Result<Trigger, TriggerError> {
        decode_event(body.as_bytes(), &Limits::default())
    }

    #[test]
    fn the_documented_trigger_body_decodes() {
        let t = ev(r#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#)
            .expect("valid");
        assert_eq!(t.name, "foo");
        assert_eq!(t.channels, ["project-3"]);
        assert_eq!(t.data, r#"{"some":"data"}"#);
        let t = ev(r#"{"name":"a","channel":"c","data":"x","socket_id":"1.2","info":"subscription_count"}"#)
            .expect("valid");
        assert_eq!(
            (t.channels, t.socket_id.as_deref()),
            (vec!["c".to_owned()], Some("1.2"))
        );
    }

    #[test]
    fn bodies_past_the_limits_are_refused_with_the_status_pusher_gives() {
        let l = Limits::default();
        assert_eq!(
            ev(r#"{"channel":"c","data":"x"}"#),
            Err(TriggerError::Name(l.max_event_name))
        );
        assert_eq!(
            ev(r#"{"name":"a","data":"x"}"#),
            Err(TriggerError::ChannelCount(l.max_trigger_channels))
        );
        let many: Vec<String> = (0..=l.max_trigger_channels)
            .map(|i| format!("\"c{i}\""))
            .collect();
        let body = format!(
            r#"{{"name":"a","data":"x","channels":[{}]}}"#,
            many.join(",")
        );
        assert_eq!(
            ev(&body),
            Err(TriggerError::ChannelCount(l.max_trigger_channels))
        );
        let big = format!(
            r#"{{"name":"a","channel":"c","data":"{}"}}"#,
            "x".repeat(l.max_event_data + 1)
        );
        let e = ev(&big).expect_err("too large");
        assert_eq!((e.status(), e.label()), (413, "data_size"));
        assert!(matches!(
            ev(r#"{"name":"a","channel":"a b","data":""}"#),
            Err(TriggerError::Channel { .. })
        ));
        assert_eq!(
            ev(r#"{"name":"a","channel":"c","data":"","socket_id":"x"}"#),
            Err(TriggerError::SocketId)
        );
        assert!(matches!(
            ev(r#"{"name":"a","channel":"c","data":{"x":1}}"#),
            Err(TriggerError::Malformed(_))
        ));
        assert!(matches!(
            ev(&"[".repeat(1000)),
            Err(TriggerError::Malformed(_))
        ));
    }

    #[test]
    fn batches_hold_one_channel_per_event_and_a_bounded_count() {
        let l = Limits::default();
        let b = decode_batch(
            br#"{"batch":[{"channel":"a","name":"e1","data":"1"},{"channel":"b","name":"e2","data":"2","socket_id":"1.1"}]}"#,
            &l,
        )
        .expect("valid");
        assert_eq!(b.len(), 2);
        assert_eq!(b[1].channels, ["b"]);
        assert_eq!(
            decode_batch(br#"{"batch":[]}"#, &l),
            Err(TriggerError::BatchSize(l.max_batch))
        );
        let items: Vec<&str> = (0..=l.max_batch)
            .map(|_| r#"{"channel":"a","name":"e","data":""}"#)
            .collect();
        let body = format!(r#"{{"batch":[{}]}}"#, items.join(","));
        assert_eq!(
            decode_batch(body.as_bytes(), &l),
            Err(TriggerError::BatchSize(l.max_batch))
        );
        assert_eq!(
            decode_batch(
                br#"{"batch":[{"channels":["a"],"name":"e","data":""}]}"#,
                &l
            ),
            Err(TriggerError::ChannelCount(1))
        );
    }
}
