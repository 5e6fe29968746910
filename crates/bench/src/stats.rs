//! Latency histograms (HDR, microseconds) and "clumps": messages of a steady feed that arrive
//! bunched together instead of at the rate they were sent (Socket.IO's failure mode in
//! µWebSockets' Raspberry Pi benchmark).

use std::time::{SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Publish-to-receive latency, in microseconds, 1 µs to 100 s at 3 significant digits.
#[derive(Debug, Clone)]
pub struct Latency {
    h: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            h: Histogram::new_with_bounds(1, 100_000_000, 3)
                .expect("constant bounds and precision are valid"),
        }
    }
}

/// A histogram as (value, count) pairs, to merge results from several processes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Buckets(pub Vec<(u64, u64)>);

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl Latency {
    /// Records one sample (clamped into range).
    pub fn record(&mut self, micros: u64) {
        let _ = self.h.record(micros.clamp(1, 100_000_000));
    }

    /// The recorded values, for merging.
    pub fn buckets(&self) -> Buckets {
        Buckets(
            self.h
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
        )
    }

    /// Adds values exported by another process.
    pub fn merge(&mut self, b: &Buckets) {
        for &(value, count) in &b.0 {
            let _ = self.h.record_n(value.clamp(1, 100_000_000), count);
        }
    }

    /// Percentiles.
    pub fn summary(&self) -> Summary {
        let q = |p: f64| self.h.value_at_quantile(p);
        Summary {
            count: self.h.len(),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: self.h.max(),
        }
    }
}

/// Counts clumps in one connection's arrivals of a feed sent every `interval_us`: a message that
/// arrives less than a tenth of the interval after the previous one arrived bunched up behind it.
#[derive(Debug, Clone, Default)]
pub struct Clumps {
    last: Option<u64>,
    /// Messages that arrived bunched.
    pub clumped: u64,
}

impl Clumps {
    /// Records an arrival at `at_us` (a monotonic clock).
    pub fn see(&mut self, at_us: u64, interval_us: u64) {
        if let Some(prev) = self.last {
            if interval_us > 0 && at_us.saturating_sub(prev) < interval_us / 10 {
                self.clumped += 1;
            }
        }
        self.last = Some(at_us);
    }
}

/// Microseconds since the Unix epoch (publisher and clients share the machine's clock).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_merging() {
        let mut a = Latency::default();
        for v in 1..=1000 {
            a.record(v);
        }
        let s = a.summary();
        assert_eq!(s.count, 1000);
        assert!((495..=505).contains(&s.p50), "{s:?}");
        assert!((985..=995).contains(&s.p99), "{s:?}");
        assert_eq!(s.max, 1000);
        let mut b = Latency::default();
        b.merge(&a.buckets());
        b.merge(&a.buckets());
        assert_eq!(b.summary().count, 2000);
        assert_eq!(b.summary().p50, s.p50);
    }

    #[test]
    fn clumps_are_arrivals_bunched_behind_another() {
        let mut c = Clumps::default();
        for t in [0, 2_000_000, 4_000_000, 4_050_000, 4_060_000, 6_000_000] {
            c.see(t, 2_000_000);
        }
        assert_eq!(c.clumped, 2);
    }
}
