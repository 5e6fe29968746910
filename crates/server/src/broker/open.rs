//! Opening the broker a configuration names: the in-memory one (with or without a durable
//! history), Redis or NATS. The server calls [`Broker::open`] once at start; which
//! implementation it gets is decided here and nowhere else.

use std::sync::Arc;

use anyhow::Context as _;

use super::{redis, AttachmentDecoder, Broker, LocalBroker, NatsBroker, RedisBroker};
use crate::config::Config;
use crate::hub::Inbox;
use crate::log;
use crate::metrics::Metrics;
use crate::redact::Urls;

impl Broker {
    /// The broker the configuration asks for: in memory unless `broker` names Redis or NATS.
    /// `decode_attachment` turns another mode's attachment bytes back into one.
    pub fn open(
        config: &Config,
        inboxes: &[Arc<Inbox>],
        metrics: &Arc<Metrics>,
        decode_attachment: Option<AttachmentDecoder>,
    ) -> anyhow::Result<Broker> {
        let Some(url) = config.broker.as_deref() else {
            if let Some(settings) = config.durable_history() {
                let (local, _) =
                    on_disk(config, inboxes, metrics, settings, decode_attachment, &[])?;
                return Ok(Broker::Local(local));
            }
            return Ok(Broker::Local(
                LocalBroker::new(
                    inboxes.to_vec(),
                    Arc::clone(metrics),
                    config.history_limits(),
                )
                .remembering(config.idempotency())
                .streaming(config.streams()),
            ));
        };
        let node = config.node();
        let timeout = std::time::Duration::from_millis(config.broker_timeout_ms.max(1));
        if redis::sentinel::is_redis_url(url) {
            let tls = redis::stream::for_config(config)
                .map_err(anyhow::Error::msg)
                .context("cannot set up TLS to Redis")?;
            let b = RedisBroker::start(
                url,
                tls,
                &redis::sentinel::SentinelAuth::for_config(config),
                &node,
                timeout,
                inboxes.to_vec(),
                Arc::clone(metrics),
                config.history_limits(),
                config.idempotency(),
                decode_attachment,
            )
            .map_err(anyhow::Error::msg)
            .context("cannot join the cluster")?
            .streaming(config.streams());
            if b.connected() {
                log::info(format_args!(
                    "node {node}: joined the cluster through {}",
                    Urls(url)
                ));
            } else {
                log::warn(format_args!(
                    "node {node}: started without the broker at {} (see above); publishes \
                 answer 503 until it is reachable",
                    Urls(url)
                ));
            }
            return Ok(Broker::Redis(b));
        }
        if url.starts_with("nats://") {
            let local = LocalBroker::new(
                inboxes.to_vec(),
                Arc::clone(metrics),
                config.history_limits(),
            )
            .remembering(config.idempotency())
            .streaming(config.streams());
            let b = NatsBroker::start(url, &node, local, Arc::clone(metrics), decode_attachment)
                .map_err(anyhow::Error::msg)
                .context("cannot join the cluster")?;
            // The link connects in the background; wait a little so the first requests find it up.
            let deadline = std::time::Instant::now() + timeout;
            while !b.connected() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if !b.connected() {
                log::warn(format_args!(
                    "node {node}: NATS at {} not reachable yet; publishes answer 503 until it is",
                    Urls(url)
                ));
            }
            log::info(format_args!(
                "node {node}: joined the cluster through {}",
                Urls(url)
            ));
            return Ok(Broker::Nats(b));
        }
        anyhow::bail!(
            "broker {:?}: expected redis://host:port or nats://host:port",
            Urls(url)
        )
    }
}

/// The in-memory broker with its history in `history_dir` (read back at start), configured as
/// `config` says; the streams of `carried_open` (a hand-over's, [`Broker::thawed_logged`]) stay
/// open and are returned as the log folds them.
pub(super) fn on_disk(
    config: &Config,
    inboxes: &[Arc<Inbox>],
    metrics: &Arc<Metrics>,
    settings: crate::durable::Settings,
    decode_attachment: Option<AttachmentDecoder>,
    carried_open: &[u64],
) -> anyhow::Result<(LocalBroker, Vec<crate::durable::load::OpenFold>)> {
    let (local, open) = LocalBroker::durable_carrying(
        inboxes.to_vec(),
        Arc::clone(metrics),
        config.history_limits(),
        settings,
        decode_attachment,
        carried_open,
    )
    .map_err(anyhow::Error::msg)
    .context("cannot open the history directory")?;
    Ok((
        local
            .remembering(config.idempotency())
            .streaming(config.streams()),
        open,
    ))
}
