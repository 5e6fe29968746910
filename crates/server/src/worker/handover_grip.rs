//! Connections a GRIP backend holds, in a hand-over (`super::handover`): a held stream
//! (`Grip-Hold: stream`, over HTTP/1.1 or as an HTTP/2 stream) and a held long-poll
//! (`Grip-Hold: response`) move with their channels (the record's topics), their position
//! (delivery continues from where the old process stopped, as for any subscriber) and what the
//! engine's `grip` table keeps for them: a stream's keep-alive, a long-poll's deadline, timeout
//! answer and backend headers. The format is [`clarion_proto::handover_grip`].
//!
//! What stays and is told to reconnect, with its reason ([`Fallback`]):
//! - a request forwarded to the backend and not answered yet (`State::Proxy`, or a WebSocket
//!   upgrade waiting for the backend's OPEN): `grip_backend`. The backend answers on the old
//!   process's connection to it; the request is not replayed, as it may not be idempotent.
//! - a WebSocket bridged with WebSocket-over-HTTP: `grip_bridge`. Its session lives in the
//!   backend's event requests (one may be in flight, events wait behind it, the backend's
//!   meta and keep-alive interval), whose answers come back to the old process.

use std::sync::Arc;

use clarion_proto::handover::GripRecord;

use super::grip::conn::{GripConn, KeepAlive, Phase, ResponseHold};
use super::handover::Fallback;
use super::socket::Socket;
use super::state::{PollMode, State, WsMode, WsRole};
use super::Engine;

/// What the `grip` table keeps for a held connection as it moves (either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarriedGrip {
    /// A held stream's keep-alive.
    KeepAlive {
        /// Bytes sent when due, framed as the stream is.
        data: Vec<u8>,
        /// Seconds between keep-alives.
        every: u32,
        /// Sent on a fixed period rather than after quiet seconds.
        interval: bool,
        /// Seconds since the last one was sent.
        since: u32,
    },
    /// A held long-poll.
    Response {
        /// Seconds left before the timeout answer.
        left: u32,
        /// The timeout answer.
        timeout: Vec<u8>,
        /// The backend's headers for a published answer.
        headers: Vec<(String, String)>,
    },
}

impl CarriedGrip {
    /// The record's part, borrowing from `self`.
    pub fn wire(&self) -> GripRecord<'_> {
        match self {
            CarriedGrip::KeepAlive {
                data,
                every,
                interval,
                since,
            } => GripRecord::KeepAlive {
                data,
                every: *every,
                interval: *interval,
                since: *since,
            },
            CarriedGrip::Response {
                left,
                timeout,
                headers,
            } => GripRecord::Response {
                left: *left,
                timeout,
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect(),
            },
        }
    }

    /// The part as read from the old process.
    pub fn from_wire(g: &GripRecord<'_>) -> CarriedGrip {
        match g {
            GripRecord::KeepAlive {
                data,
                every,
                interval,
                since,
            } => CarriedGrip::KeepAlive {
                data: data.to_vec(),
                every: *every,
                interval: *interval,
                since: *since,
            },
            GripRecord::Response {
                left,
                timeout,
                headers,
            } => CarriedGrip::Response {
                left: *left,
                timeout: timeout.to_vec(),
                headers: headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            },
        }
    }

    /// Bytes of the part in a record, for sizing a batch's buffer.
    pub fn size(&self) -> usize {
        16 + match self {
            CarriedGrip::KeepAlive { data, .. } => 16 + data.len(),
            CarriedGrip::Response {
                timeout, headers, ..
            } => {
                16 + timeout.len()
                    + headers
                        .iter()
                        .map(|(n, v)| 4 + n.len() + v.len())
                        .sum::<usize>()
            }
        }
    }

    /// The state a record arrives in: a poll with a hold is a GRIP long-poll (the record's
    /// transport byte does not say so; its part does).
    pub fn arriving_state(state: State, part: Option<&CarriedGrip>) -> State {
        match (state, part) {
            (State::Poll(PollMode { keep, .. }), Some(CarriedGrip::Response { .. })) => {
                State::Poll(PollMode { keep, grip: true })
            }
            (s, Some(CarriedGrip::Response { .. } | CarriedGrip::KeepAlive { .. }) | None) => s,
        }
    }
}

impl<S: Socket> Engine<S> {
    /// Why connection `k` in `state`, forwarded to or held by a GRIP backend, cannot move;
    /// `None` when it can (a held stream or long-poll) or GRIP has no part in it.
    pub(super) fn grip_blocker(&self, k: u32, state: State) -> Option<Fallback> {
        match state {
            State::Proxy => return Some(Fallback::GripBackend),
            State::Ws(WsMode {
                role: WsRole::Bridge,
                ..
            }) => return Some(Fallback::GripBridge),
            State::Http
            | State::Ws(_)
            | State::Sse(_)
            | State::Stream(_)
            | State::Poll(_)
            | State::H2
            | State::Closing { .. } => {}
        }
        match self.grip.get(&k).map(|g| &g.phase) {
            None | Some(Phase::Stream(_) | Phase::Response(_)) => None,
            Some(Phase::Waiting(_)) => Some(Fallback::GripBackend),
            Some(Phase::Ws(_)) => Some(Fallback::GripBridge),
        }
    }

    /// Takes what the `grip` table keeps for `k`, about to move (quietly: the backend is not
    /// told anything, the hold continues in the new process). Before the release, which
    /// forgets it. `None` for a held stream without a keep-alive, or a connection GRIP does
    /// not hold.
    pub(super) fn take_grip(&mut self, k: u32) -> Option<CarriedGrip> {
        let movable = matches!(
            self.grip.get(&k).map(|g| &g.phase),
            Some(Phase::Stream(_) | Phase::Response(_))
        );
        if !movable {
            return None;
        }
        let GripConn {
            // A ticket matches backend answers, which a hold no longer waits for; the route
            // serves a bridge's requests only. The new process gives its own.
            ticket: _,
            route: _,
            phase,
        } = self.grip.remove(&k)?;
        match phase {
            Phase::Stream(ka) => {
                let KeepAlive {
                    data,
                    every,
                    interval,
                    last,
                } = *ka;
                Some(CarriedGrip::KeepAlive {
                    data: data.to_vec(),
                    every,
                    interval,
                    since: self.now.saturating_sub(last),
                })
            }
            Phase::Response(hold) => {
                let ResponseHold {
                    deadline,
                    timeout,
                    headers,
                } = *hold;
                Some(CarriedGrip::Response {
                    left: deadline.saturating_sub(self.now),
                    timeout: timeout.to_vec(),
                    headers: headers
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.to_string()))
                        .collect(),
                })
            }
            // Not movable (checked above); not reached.
            Phase::Waiting(_) | Phase::Ws(_) => None,
        }
    }

    /// Puts back what the `grip` table kept for `k`, arriving from the old process: its
    /// keep-alive continues on the same period, its long-poll ends at the same time.
    pub(super) fn restore_grip(&mut self, k: u32, part: Option<CarriedGrip>) {
        let Some(part) = part else {
            return;
        };
        let ticket = self.shared.grip.as_ref().map_or(0, |p| p.ticket());
        let phase = match part {
            CarriedGrip::KeepAlive {
                data,
                every,
                interval,
                since,
            } => Phase::Stream(Box::new(KeepAlive {
                data: Arc::from(data),
                every: every.max(1),
                interval,
                last: self.now.saturating_sub(since),
            })),
            CarriedGrip::Response {
                left,
                timeout,
                headers,
            } => Phase::Response(Box::new(ResponseHold {
                deadline: self.now.saturating_add(left),
                timeout: Arc::from(timeout),
                headers: headers
                    .into_iter()
                    .map(|(n, v)| (Box::from(n), Box::from(v)))
                    .collect(),
            })),
        };
        self.grip.insert(
            k,
            GripConn {
                ticket,
                route: 0,
                phase,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_grip_part_round_trips_through_its_wire_form() {
        let parts = [
            CarriedGrip::KeepAlive {
                data: b"1\r\n\n\r\n".to_vec(),
                every: 15,
                interval: true,
                since: 4,
            },
            CarriedGrip::Response {
                left: 30,
                timeout: b"HTTP/1.1 304 Not Modified\r\n\r\n".to_vec(),
                headers: vec![("ETag".into(), "\"v1\"".into())],
            },
        ];
        for p in parts {
            assert_eq!(CarriedGrip::from_wire(&p.wire()), p);
            let mut out = Vec::new();
            clarion_proto::handover_grip::encode(Some(&p.wire()), &mut out);
            assert!(out.len() <= p.size(), "{} > {}", out.len(), p.size());
        }
    }

    #[test]
    fn a_poll_with_a_hold_arrives_as_a_grip_long_poll() {
        let hold = CarriedGrip::Response {
            left: 1,
            timeout: Vec::new(),
            headers: Vec::new(),
        };
        let poll = State::Poll(PollMode {
            keep: true,
            grip: false,
        });
        assert_eq!(
            CarriedGrip::arriving_state(poll, Some(&hold)),
            State::Poll(PollMode {
                keep: true,
                grip: true
            })
        );
        assert_eq!(CarriedGrip::arriving_state(poll, None), poll);
    }
}
