//! The families of delta compression (`docs/delta.md`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{counter, Metrics};

impl Metrics {
    pub(super) fn render_delta(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        counter(
            out,
            "clarion_deltas_computed_total",
            "Publications of delta_topics whose delta was computed (once per publication per node).",
            l(&self.deltas_computed),
        );
        counter(
            out,
            "clarion_delta_refused_total",
            "Subscriptions whose delta request was refused (topic not in delta_topics, or no envelope).",
            l(&self.delta_refused),
        );
    }
}
