//! The soak's client mix: which kind each logical client is ([`SoakTransport`]) and which
//! topics it follows, and the per-kind sums of the workers' reports. `--soak-browser-share`
//! percent of the clients connect as browsers and Clarion's own clients do (deflate WebSockets
//! with an in-band compressed subscribe, HTTP/2 connections with several SSE streams, over
//! TLS 1.3 too when the group listens for it); the others take `--soak-transport` in turn.

use serde::Serialize;

use crate::soak_check::SoakCounts;
use crate::soak_life::SoakTransport;
use crate::soak_worker::KindReport;

/// How the clients are chosen.
#[derive(Debug, Clone)]
pub struct Mix {
    /// The kinds of the other clients, in turn.
    pub plain: Vec<SoakTransport>,
    /// Percent of clients that are browser-like.
    pub browser_share: u64,
    /// The server listens for TLS: the browser-like kinds include the TLS ones.
    pub tls: bool,
    /// Streams per HTTP/2 client.
    pub h2_streams: u32,
    /// Topics.
    pub topics: usize,
}

impl Mix {
    /// Client `i`'s kind and topics. Browser-like clients are spread evenly (client `i` is one
    /// when `floor((i+1)·share/100)` steps up) and take their kinds in turn; an HTTP/2
    /// client's streams follow consecutive topics from its own.
    pub fn client(&self, i: usize) -> (Vec<u32>, SoakTransport) {
        let share = self.browser_share.min(100);
        let n = i as u64;
        let browser_before = n * share / 100;
        let browser = (n + 1) * share / 100 > browser_before;
        let kind = if browser {
            let kinds: &[SoakTransport] = if self.tls {
                &[
                    SoakTransport::WsDeflate,
                    SoakTransport::H2Sse,
                    SoakTransport::TlsWsDeflate,
                    SoakTransport::TlsH2Sse,
                ]
            } else {
                &[SoakTransport::WsDeflate, SoakTransport::H2Sse]
            };
            kinds
                .get(browser_before as usize % kinds.len())
                .copied()
                .unwrap_or(SoakTransport::WsDeflate)
        } else {
            let plain_before = (n - browser_before) as usize;
            self.plain
                .get(plain_before % self.plain.len().max(1))
                .copied()
                .unwrap_or(SoakTransport::Ws)
        };
        let topics = self.topics.max(1);
        let streams = if kind.h2() { self.h2_streams.max(1) } else { 1 };
        let topics = (0..streams as usize)
            .map(|k| ((i + k) % topics) as u32)
            .collect();
        (topics, kind)
    }
}

/// What the clients of one kind measured, over every worker.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KindOutcome {
    /// The kind (`ws`, `sse`, `ws-deflate`, `h2-sse`, `tls-ws-deflate`, `tls-h2-sse`).
    pub kind: String,
    /// Clients (one connection at a time each).
    pub clients: u64,
    /// Subscriptions (streams, for HTTP/2).
    pub subscriptions: u64,
    /// Subscriptions that never received a message.
    pub never_received: u64,
    /// Deliveries checked.
    pub counts: SoakCounts,
    /// Lost outside announced gaps.
    pub lost: u64,
    /// Per Unix second: connections dropped (ended by the server or failed).
    pub drops: Vec<(u64, u32)>,
    /// Why, per Unix second: (second, why, count).
    pub errors: Vec<(u64, String, u32)>,
}

/// Adds one worker's report of a kind.
pub fn add(kinds: &mut Vec<KindOutcome>, r: KindReport) {
    let name = r.kind.name();
    let k = match kinds.iter().position(|k| k.kind == name) {
        Some(i) => kinds.get_mut(i),
        None => {
            kinds.push(KindOutcome {
                kind: name.to_string(),
                ..KindOutcome::default()
            });
            kinds.last_mut()
        }
    };
    let Some(k) = k else {
        return;
    };
    k.clients += r.clients;
    k.subscriptions += r.subscriptions;
    k.never_received += r.never_received;
    k.counts.add(&r.counts);
    k.lost += r.counts.holes_unlisted;
    k.drops.extend(r.drops);
    k.errors.extend(r.errors);
}

/// Sorts each kind's series and merges the seconds the workers share, in the order of
/// [`SoakTransport::ALL`].
pub fn finish(kinds: &mut [KindOutcome]) {
    for k in kinds.iter_mut() {
        k.drops.sort_unstable();
        k.drops.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
            }
            same
        });
        k.errors.sort_unstable();
    }
    kinds.sort_by_key(|k| {
        SoakTransport::ALL
            .iter()
            .position(|t| t.name() == k.kind)
            .unwrap_or(usize::MAX)
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mix(share: u64, tls: bool) -> Mix {
        Mix {
            plain: vec![SoakTransport::Ws, SoakTransport::Sse],
            browser_share: share,
            tls,
            h2_streams: 6,
            topics: 1000,
        }
    }

    #[test]
    fn the_share_is_exact_and_every_kind_is_used_in_turn() {
        let m = mix(40, true);
        let kinds: Vec<SoakTransport> = (0..4000).map(|i| m.client(i).1).collect();
        let count = |t| kinds.iter().filter(|&&k| k == t).count();
        assert_eq!(count(SoakTransport::Ws), 1200);
        assert_eq!(count(SoakTransport::Sse), 1200);
        for t in [
            SoakTransport::WsDeflate,
            SoakTransport::H2Sse,
            SoakTransport::TlsWsDeflate,
            SoakTransport::TlsH2Sse,
        ] {
            assert_eq!(count(t), 400, "{t:?}");
        }
        let (topics, kind) = (0..10).map(|i| m.client(i)).find(|c| c.1.h2()).unwrap();
        assert_eq!((topics.len(), kind.h2()), (6, true));
        assert_eq!(topics.windows(2).filter(|w| w[1] == w[0] + 1).count(), 5);
    }

    #[test]
    fn without_tls_or_share_the_mix_is_clear_or_plain() {
        let m = mix(40, false);
        assert!((0..1000).all(|i| !m.client(i).1.tls()));
        let m = mix(0, true);
        assert!((0..1000).all(|i| matches!(m.client(i).1, SoakTransport::Ws | SoakTransport::Sse)));
        assert_eq!(m.client(999).0, vec![999]);
    }
}
