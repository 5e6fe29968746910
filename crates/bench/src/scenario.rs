//! The scenario presets: what `--scenario` sets before the run, unless a flag says otherwise.

use crate::plan::{stages, BenchArgs, Scenario};

pub(crate) fn apply_scenario(a: &mut BenchArgs) {
    match a.scenario {
        Some(Scenario::Idle) => {
            a.hold = a.hold.max(10);
            a.messages = 1;
        }
        Some(Scenario::Burst) => {
            a.topics = 1;
            a.messages = 100;
            a.interval_ms = 0;
        }
        Some(Scenario::Ticker) => {
            // `--interval-ms` chooses another pace (µWebSockets' Raspberry Pi ticker is 2 s;
            // issue 22's is 500 ms).
            if a.interval_ms == 0 {
                a.interval_ms = 2000;
            }
            if a.messages == 100 {
                a.messages = 30;
            }
        }
        Some(Scenario::Topics) => {
            // Chat rooms, as in Pushpin's benchmark: 10,000 topics. One server process holds
            // at most ~20,000 sockets here, so rooms have 1-2 members uniformly, or from one
            // to hundreds with `--distribution skewed`.
            if a.topics == 1 {
                a.topics = 10_000;
            }
            a.messages = a.messages.min(20);
        }
        Some(Scenario::Churn) => {
            // One message per cycle proves each generation of connections was live.
            a.messages = 1;
            a.hold = 0;
            a.steps.clear();
        }
        Some(Scenario::Million) => {
            // The published million-socket runs: one message a minute per socket, held 10
            // minutes; 10,000 chat rooms.
            if a.interval_ms == 0 {
                a.interval_ms = 60_000;
            }
            if a.hold == 0 {
                a.hold = 600;
            }
            if a.topics == 1 {
                a.topics = 10_000;
            }
            a.steps.clear();
        }
        Some(Scenario::Soak) => {
            // Issue 34's soak: 1,000 topics at 1,000 messages a second (one a second each).
            if a.topics == 1 {
                a.topics = 1000;
            }
            a.steps.clear();
        }
        Some(Scenario::Streams) => {
            // Issue 52: 1,000 concurrent AI streams.
            if a.topics == 1 {
                a.topics = 1000;
            }
            a.steps.clear();
        }
        None => {}
    }
    if let Some(&last) = stages(&a.steps, a.connections).last() {
        a.connections = last;
    }
}
