//! Subscription filters' counters (`docs/filters.md`): evaluations (one per publication per
//! distinct filter on a worker, however many subscribers share it), the distinct filters held,
//! and refusals of filters and of publications' tags, by reason.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a filter or a publication's tags were refused: `FilterError::reason` labels, and
/// `tags` for a publish whose tags break the bounds.
pub const FILTER_REFUSALS: [&str; 12] = [
    "empty",
    "too_long",
    "too_deep",
    "too_many_terms",
    "list_too_long",
    "syntax",
    "bad_number",
    "type_mismatch",
    "bad_key",
    "value_too_long",
    "json",
    "tags",
];

/// Filter counters.
#[derive(Debug, Default)]
pub struct FilterCounters {
    /// Filter evaluations: one per message per distinct filter per worker.
    pub evaluations: AtomicU64,
    /// Distinct filters held by subscriptions, summed over workers.
    pub distinct: AtomicU64,
    refused: [AtomicU64; FILTER_REFUSALS.len()],
}

impl FilterCounters {
    /// Counts one refusal with `reason` (one of [`FILTER_REFUSALS`]).
    pub fn refused(&self, reason: &str) {
        if let Some(c) = FILTER_REFUSALS
            .iter()
            .position(|o| *o == reason)
            .and_then(|i| self.refused.get(i))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// The families, in Prometheus' text format.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP clarion_filter_evaluations_total Filter evaluations: one per message per \
             distinct filter per worker.\n\
             # TYPE clarion_filter_evaluations_total counter\n\
             clarion_filter_evaluations_total {}\n\
             # HELP clarion_filters Distinct subscription filters held (summed over workers).\n\
             # TYPE clarion_filters gauge\n\
             clarion_filters {}",
            self.evaluations.load(Relaxed),
            self.distinct.load(Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP clarion_filter_rejected_total Filters and publication tags refused, by \
             reason.\n\
             # TYPE clarion_filter_rejected_total counter"
        );
        for (name, c) in FILTER_REFUSALS.iter().zip(&self.refused) {
            let _ = writeln!(
                out,
                "clarion_filter_rejected_total{{reason=\"{name}\"}} {}",
                c.load(Relaxed)
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clarion_proto::filter::{parse, Limits};

    #[test]
    fn every_parse_refusal_has_a_label() {
        let limits = Limits::default();
        for bad in [
            "",
            "a ==",
            "a == 1",
            "a < \"x\"",
            "in == \"1\"",
            "a < 1e999",
        ] {
            let e = parse(bad, &limits).unwrap_err();
            assert!(FILTER_REFUSALS.contains(&e.reason()), "{}", e.reason());
        }
        let c = FilterCounters::default();
        c.refused("syntax");
        let mut out = String::new();
        c.render(&mut out);
        assert!(out.contains("clarion_filter_rejected_total{reason=\"syntax\"} 1"));
        assert!(out.contains("clarion_filter_evaluations_total 0"));
    }
}
