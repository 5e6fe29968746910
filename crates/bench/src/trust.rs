//! Whether a run's figures can be believed. A figure measured with too little signal (a few
//! clock ticks of CPU, a few pages of RSS) or on a server that reuses memory an earlier run left
//! behind is printed with a warning saying why and what to do, instead of as a plain number.

use crate::outcome::Outcome;

/// A page: the step in which RSS grows.
const PAGE: f64 = 4096.0;
/// Below this many user-space bytes per connection no server holds a TCP connection (a socket
/// record alone is larger; Clarion's is 64 bytes), so a smaller figure means memory was reused.
const PLAUSIBLE_BYTES: f64 = 32.0;
/// The kernel counts CPU time in ticks of 10 ms (`USER_HZ` = 100).
const TICK_SECONDS: f64 = 0.01;
/// A CPU figure is trusted when the tick rounding is at most this share of it.
const CPU_ROUNDING: f64 = 0.05;
/// Connections below which the machine-wide kernel memory delta is mostly other activity.
const KERNEL_MIN_CONNECTIONS: u64 = 1000;

/// What was read from the server before the run began.
#[derive(Debug, Clone, Copy, Default)]
pub struct Before {
    /// RSS, bytes.
    pub rss: Option<u64>,
    /// The highest RSS the server ever had (`VmHWM`), bytes.
    pub peak_rss: Option<u64>,
}

/// The warnings for `o`, each a sentence saying which figure and why. `publish_cpu` is the
/// server's CPU seconds while publishing (what the per-delivery figure divides).
pub fn warnings(o: &Outcome, before: Before, publish_cpu: Option<f64>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(b) = o.server_bytes_per_connection.filter(|_| o.opened > 0) {
        memory(&mut out, b, o.opened, before);
    }
    if let Some(cpu) = publish_cpu.filter(|_| o.server_cpu_per_million.is_some()) {
        let rounding = TICK_SECONDS / cpu.max(TICK_SECONDS);
        if rounding > CPU_ROUNDING {
            out.push(format!(
                "server CPU per delivery: the server used {cpu:.2} s of CPU while publishing, \
                 counted in {:.0} ms ticks, so the figure is only good to about ±{:.0}%; \
                 publish more messages (-m) or to more connections",
                TICK_SECONDS * 1e3,
                rounding * 100.0
            ));
        }
    }
    if o.kernel_bytes_per_connection.is_some() && o.opened < KERNEL_MIN_CONNECTIONS {
        out.push(format!(
            "kernel memory per connection: measured machine-wide over only {} connections, so \
             other activity on the machine dominates it; use at least {KERNEL_MIN_CONNECTIONS}",
            o.opened
        ));
    }
    out
}

fn memory(out: &mut Vec<String>, b: f64, opened: u64, before: Before) {
    if let (Some(rss), Some(peak)) = (before.rss, before.peak_rss) {
        // Memory returned to the system since the peak will be taken again before RSS grows.
        let returned = peak.saturating_sub(rss);
        if returned as f64 > (b.max(0.0) * opened as f64 / 4.0).max(16.0 * PAGE) {
            out.push(format!(
                "server memory per connection: the server's RSS was {:.1} MiB at its peak and \
                 {:.1} MiB when this run began, so the memory an earlier run used is taken \
                 again before RSS grows and {b:.1} B understates; restart the server before \
                 measuring memory",
                peak as f64 / 1048576.0,
                rss as f64 / 1048576.0
            ));
            return;
        }
    }
    if b < PLAUSIBLE_BYTES {
        out.push(format!(
            "server memory per connection: {b:.1} B is below what any server needs to hold a \
             connection: its allocator is most likely reusing memory an earlier run freed \
             (RSS does not shrink back); restart the server before measuring memory"
        ));
        return;
    }
    let resolution = PAGE / opened as f64;
    if resolution > 0.1 * b {
        out.push(format!(
            "server memory per connection: RSS grows in 4 KiB pages, which is {resolution:.1} B \
             per connection over {opened} connections: the figure ({b:.1} B) is only a rough \
             one; open more connections (-n)"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(opened: u64, bytes: Option<f64>) -> Outcome {
        let mut o = crate::report::tests::sample_outcome();
        o.opened = opened;
        o.server_bytes_per_connection = bytes;
        o.kernel_bytes_per_connection = Some(8000.0);
        o.server_cpu_per_million = Some(4.0);
        o
    }

    #[test]
    fn a_reused_heap_is_called_out() {
        // The figures a second run against the same server printed without a word: 8.2 and 0.
        for b in [8.2, 0.0, -3.0] {
            let w = warnings(&outcome(20_000, Some(b)), Before::default(), Some(10.0));
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].contains("restart the server"), "{w:?}");
        }
        let before = Before {
            rss: Some(10 << 20),
            peak_rss: Some(200 << 20),
        };
        let w = warnings(&outcome(20_000, Some(90.0)), before, Some(10.0));
        assert!(w[0].contains("200.0 MiB at its peak"), "{w:?}");
    }

    #[test]
    fn a_plausible_run_has_no_warning() {
        let before = Before {
            rss: Some(5 << 20),
            peak_rss: Some(5 << 20),
        };
        assert!(warnings(&outcome(20_000, Some(85.0)), before, Some(1.5)).is_empty());
        assert!(warnings(&outcome(20_000, None), Before::default(), None).is_empty());
    }

    #[test]
    fn thin_signals_are_called_out() {
        let w = warnings(&outcome(100, Some(200.0)), Before::default(), Some(0.04));
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("41.0 B per connection over 100"), "{w:?}");
        assert!(w[1].contains("only good to about ±25%"), "{w:?}");
        assert!(w[2].contains("only 100 connections"), "{w:?}");
    }
}
