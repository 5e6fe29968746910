//! The broker's part of a connection hand-over (`crate::handover`): whether this broker can be
//! handed over at all, freezing it, and continuing it in the new process. Each question is one
//! match over the implementations, so the hand-over never names one.

use std::sync::Arc;

use super::{local, AttachmentDecoder, Broker, LocalBroker};
use crate::config::Config;
use crate::durable;
use crate::hub::{Hub, Inbox};
use crate::metrics::Metrics;

/// Where a frozen broker stands, for the new process.
pub enum Frozen {
    /// The in-memory broker: its ids and its history ([`LocalBroker::freeze`]).
    History(local::Frozen),
    /// A broker whose history is shared by the cluster (Redis): per topic followed here, the id
    /// of the last message handed to this process's workers; the history stays where it is.
    Positions(Vec<(Arc<str>, String)>),
}

impl Broker {
    /// Why this broker's connections cannot be handed over, if they cannot.
    pub fn handover_refusal(&self) -> Option<&'static str> {
        match self {
            Broker::Local(_) | Broker::Redis(_) => None,
            Broker::Nats(_) => Some("a NATS broker's subscriptions are not handed over"),
        }
    }

    /// Freezes publishing (and a clustered broker's live deliveries) for a hand-over, and says
    /// where it stands; `None` when it cannot be handed over ([`Broker::handover_refusal`]).
    pub fn freeze(&self) -> Option<Frozen> {
        match self {
            Broker::Local(b) => Some(Frozen::History(b.freeze())),
            Broker::Redis(b) => Some(Frozen::Positions(b.freeze())),
            Broker::Nats(_) => None,
        }
    }

    /// Whether subscribers handed over with per-topic positions ([`Frozen::Positions`]) can be
    /// resumed here: the history they point into is the cluster's.
    pub fn resumes_from_positions(&self) -> bool {
        match self {
            Broker::Redis(_) => true,
            Broker::Local(_) | Broker::Nats(_) => false,
        }
    }

    /// The `SEQ` the in-memory broker gives next; `None` for a clustered broker (its ids are
    /// per topic).
    pub fn next_id(&self) -> Option<u64> {
        match self {
            Broker::Local(b) => Some(b.next_id()),
            Broker::Redis(_) | Broker::Nats(_) => None,
        }
    }

    /// The in-memory broker continuing a handed-over one: its epoch, its next id, its
    /// history (`hub`, see [`LocalBroker::thawed`]) and its open streams, with this process's
    /// settings.
    pub fn thawed(
        inboxes: Vec<Arc<Inbox>>,
        metrics: Arc<Metrics>,
        config: &Config,
        epoch: Arc<str>,
        next_id: u64,
        hub: Hub,
        streams: local::streams::Carried,
    ) -> Broker {
        let b = LocalBroker::thawed(
            inboxes,
            metrics,
            config.history_limits(),
            epoch,
            next_id,
            hub,
        )
        .remembering(config.idempotency())
        .streaming(config.streams());
        let now = b.clock();
        Broker::Local(b.carry_on(streams, now))
    }

    /// The in-memory broker with `history_dir` continuing a handed-over one: history is read
    /// back from the directory (the old process closed its log cleanly), and the open
    /// `streams` it carried stay open, reconciled with the log's fold
    /// ([`LocalBroker::carry_on_logged`]). They are closed by the restart as at any start when
    /// the directory does not continue the old process's `epoch` (their ids are in it).
    pub fn thawed_logged(
        inboxes: &[Arc<Inbox>],
        metrics: &Arc<Metrics>,
        config: &Config,
        settings: durable::Settings,
        decode_attachment: Option<AttachmentDecoder>,
        epoch: &str,
        streams: local::streams::Carried,
    ) -> anyhow::Result<Broker> {
        let ids: Vec<u64> = streams.open.iter().map(|s| s.id).collect();
        let (b, logged) =
            super::open::on_disk(config, inboxes, metrics, settings, decode_attachment, &ids)?;
        let streams = if b.epoch() == epoch {
            streams
        } else {
            crate::log::warn(format_args!(
                "hand-over: history_dir begins epoch {} after epoch {epoch}: its {} open \
                 streams are closed by the restart",
                b.epoch(),
                ids.len()
            ));
            local::streams::Carried::default()
        };
        let now = b.clock();
        Ok(Broker::Local(b.carry_on_logged(streams, logged, now)))
    }
}
