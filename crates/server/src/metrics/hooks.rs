//! The families of backend hooks and webhooks (`docs/hooks.md`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{counter, gauge, Metrics};

/// The hooks as `clarion_hook_*` counts them: `connect`, `subscribe`, `publish`.
pub const HOOKS: [&str; 3] = ["connect", "subscribe", "publish"];
/// What a hook call came to: the backend allowed, refused, or could not answer usably.
pub const HOOK_OUTCOMES: [&str; 3] = ["allow", "refuse", "failure"];

/// Backend hook counters, by hook (index into [`HOOKS`]).
#[derive(Debug, Default)]
pub struct HookCounters {
    /// Calls made, by hook and outcome (index into [`HOOK_OUTCOMES`]).
    pub calls: [[AtomicU64; 3]; 3],
    /// Answers taken from the cache instead of a call, by hook.
    pub cache_hits: [AtomicU64; 3],
    /// Microseconds spent in calls that got an answer, by hook (latency sum).
    pub latency_us: [AtomicU64; 3],
    /// Calls queued or in flight now.
    pub in_flight: AtomicU64,
    /// Calls not made: the client's address had `hook_max_in_flight_per_address` in flight.
    pub address_limited: AtomicU64,
    /// Webhook events delivered (2xx), in batches.
    pub webhook_sent: AtomicU64,
    /// Webhook requests answered 2xx.
    pub webhook_batches: AtomicU64,
    /// Webhook requests that failed and were tried again.
    pub webhook_retries: AtomicU64,
    /// Webhook events dropped: the queue was full (or the server stopped while retrying).
    pub webhook_dropped: AtomicU64,
    /// Webhook events the application refused (a 4xx other than 408 and 429): not retried.
    pub webhook_rejected: AtomicU64,
    /// Webhook events waiting to be sent.
    pub webhook_queued: AtomicU64,
}

impl Metrics {
    pub(super) fn render_hooks(&self, out: &mut String) {
        let h = &self.hooks;
        let _ = writeln!(
            out,
            "# HELP clarion_hook_calls_total Backend hook calls, by hook and outcome.\n\
             # TYPE clarion_hook_calls_total counter"
        );
        for (i, hook) in HOOKS.iter().enumerate() {
            for (j, outcome) in HOOK_OUTCOMES.iter().enumerate() {
                let n = h
                    .calls
                    .get(i)
                    .and_then(|c| c.get(j))
                    .map_or(0, |c| c.load(Relaxed));
                let _ = writeln!(
                    out,
                    "clarion_hook_calls_total{{hook=\"{hook}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        for (name, help, values) in [
            (
                "clarion_hook_cache_hits_total",
                "Hook answers reused from the cache, by hook.",
                &h.cache_hits,
            ),
            (
                "clarion_hook_latency_microseconds_total",
                "Time spent in answered hook calls, by hook (divide by the calls).",
                &h.latency_us,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (hook, v) in HOOKS.iter().zip(values) {
                let _ = writeln!(out, "{name}{{hook=\"{hook}\"}} {}", v.load(Relaxed));
            }
        }
        gauge(
            out,
            "clarion_hook_in_flight",
            "Hook calls queued or in flight.",
            h.in_flight.load(Relaxed),
        );
        for (name, help, v) in [
            (
                "clarion_hook_address_limited_total",
                "Hook calls not made: the client's address had hook_max_in_flight_per_address calls in flight.",
                &h.address_limited,
            ),
            (
                "clarion_webhook_events_total",
                "Webhook events delivered.",
                &h.webhook_sent,
            ),
            (
                "clarion_webhook_requests_total",
                "Webhook requests answered 2xx.",
                &h.webhook_batches,
            ),
            (
                "clarion_webhook_retries_total",
                "Webhook requests tried again.",
                &h.webhook_retries,
            ),
            (
                "clarion_webhook_dropped_total",
                "Webhook events dropped (queue full).",
                &h.webhook_dropped,
            ),
            (
                "clarion_webhook_rejected_total",
                "Webhook events the application refused with a 4xx other than 408/429 (not retried).",
                &h.webhook_rejected,
            ),
        ] {
            counter(out, name, help, v.load(Relaxed));
        }
        gauge(
            out,
            "clarion_webhook_queued",
            "Webhook events waiting to be sent.",
            h.webhook_queued.load(Relaxed),
        );
    }
}
