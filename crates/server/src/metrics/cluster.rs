//! The families of the features that span processes: presence rooms and the cluster broker
//! (rendered only when a broker is configured), beside the process-wide ones in [`super`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{counter, gauge, Metrics};

impl Metrics {
    pub(super) fn render_presence(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        gauge(
            out,
            "clarion_presence_members",
            "Presence members (distinct identities) summed over this process's rooms.",
            l(&self.presence_members),
        );
        gauge(
            out,
            "clarion_presence_connections",
            "Connections in presence rooms, with or without an identity.",
            l(&self.presence_connections),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_presence_events_total Presence events sent, by type.\n\
             # TYPE clarion_presence_events_total counter\n\
             clarion_presence_events_total{{type=\"join\"}} {}\n\
             clarion_presence_events_total{{type=\"leave\"}} {}",
            l(&self.presence_joins),
            l(&self.presence_leaves)
        );
    }

    pub(super) fn render_broker(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        gauge(
            out,
            "clarion_broker_connected",
            "1 while the cluster broker's subscriber connection is up.",
            l(&self.broker_connected),
        );
        gauge(
            out,
            "clarion_broker_commands_in_flight",
            "Broker commands sent and not answered yet.",
            l(&self.broker_in_flight),
        );
        counter(
            out,
            "clarion_broker_reconnects_total",
            "Times the broker's subscriber connection was made again.",
            l(&self.broker_reconnects),
        );
        counter(
            out,
            "clarion_broker_errors_total",
            "Broker commands or connections that failed.",
            l(&self.broker_errors),
        );
        counter(
            out,
            "clarion_broker_holes_filled_total",
            "Holes in a topic's live sequence filled from the broker's history.",
            l(&self.broker_holes_filled),
        );
        counter(
            out,
            "clarion_broker_live_gaps_total",
            "Gap notices sent live (a hole history could not fill, or a new epoch).",
            l(&self.broker_live_gaps),
        );
        let resumes = l(&self.resumes);
        let gaps = l(&self.resume_gaps);
        let _ = writeln!(
            out,
            "# HELP clarion_broker_recoveries_total Resumes by outcome: exact or with a gap notice.\n\
             # TYPE clarion_broker_recoveries_total counter\n\
             clarion_broker_recoveries_total{{result=\"exact\"}} {}\n\
             clarion_broker_recoveries_total{{result=\"gap\"}} {}",
            resumes.saturating_sub(gaps),
            gaps
        );
    }
}
