//! Publishing: one pipeline of script calls per shard, each message's receipt in its place.

use std::sync::atomic::Ordering::Relaxed;

use clarion_proto::resp::Value;

use super::layout::{idempotency_key, keys, partition};
use super::{conn, RedisBroker, META_TTL_SECS, SCRIPT};
use crate::broker::{Outgoing, Receipt, Unavailable};

impl RedisBroker {
    /// Publishes `msgs` in order (one pipeline of script calls). A broker failure answers
    /// [`Unavailable`]; messages before the failure may have been published.
    pub fn publish(&self, msgs: &[Outgoing<'_>]) -> Result<Vec<Receipt>, Unavailable> {
        let core = &self.core;
        let limits = &core.limits;
        let size = if limits.enabled() {
            limits.per_topic
        } else {
            0
        };
        let ttl = u64::from(limits.ttl).max(1);
        let meta_ttl = ttl.max(META_TTL_SECS);
        let replids = core.accepted_replids();
        let mut commands = Vec::with_capacity(msgs.len());
        let window_ms = core.idempotency.window.as_millis().max(1).to_string();
        for m in msgs {
            let [meta, stream, channel] = keys(m.topic);
            let body = m.wire_body();
            let key = m.key.filter(|_| !core.idempotency.window.is_zero());
            let mut cmd = vec![
                b"EVALSHA".to_vec(),
                core.sha.clone().into_bytes(),
                if key.is_some() { b"3" } else { b"2" }.to_vec(),
                meta.into_bytes(),
                stream.into_bytes(),
            ];
            if let Some(k) = key {
                cmd.push(idempotency_key(m.topic, k).into_bytes());
            }
            cmd.extend([
                channel.into_bytes(),
                body,
                size.to_string().into_bytes(),
                ttl.to_string().into_bytes(),
                core.fresh_epoch().into_bytes(),
                meta_ttl.to_string().into_bytes(),
                conn::REPLID_ARG.to_vec(),
                window_ms.clone().into_bytes(),
            ]);
            cmd.extend(replids.iter().cloned());
            commands.push((partition(m.topic), cmd));
        }
        // One pipeline per shard, in order; the replies go back to their messages' places.
        let replies = core.run_routed(SCRIPT, &commands)?;
        let mut receipts = Vec::with_capacity(msgs.len());
        for r in replies {
            let Value::Array(parts) = r else {
                let why = match r {
                    Value::Error(e) => e,
                    other => format!("unexpected answer {other:?}"),
                };
                core.metrics.broker_errors.fetch_add(1, Relaxed);
                return Err(Unavailable(format!(
                    "the broker refused the publish: {why}"
                )));
            };
            let epoch = parts.first().and_then(Value::as_str).unwrap_or("0");
            let offset = parts.get(1).and_then(Value::as_int).unwrap_or(0);
            let nodes = parts.get(2).and_then(Value::as_int).unwrap_or(0);
            let repeat = parts.get(3).and_then(Value::as_int) == Some(1);
            receipts.push(Receipt {
                id: format!("{epoch}-{offset}"),
                subscribers: u64::try_from(nodes).unwrap_or(0),
                repeat,
            });
        }
        let repeats = receipts.iter().filter(|r| r.repeat).count() as u64;
        core.metrics.publish_repeats.fetch_add(repeats, Relaxed);
        core.metrics
            .published
            .fetch_add(msgs.len() as u64 - repeats, Relaxed);
        Ok(receipts)
    }
}
