//! Connections a GRIP backend holds, in a hand-over (`super::handover`): a held stream
//! (`Grip-Hold: stream`, over HTTP/1.1 or as an HTTP/2 stream) and a held long-poll
//! (`Grip-Hold: response`) move with their channels (the record's topics), their position
//! (delivery continues from where the old process stopped, as for any subscriber) and what the
//! engine's `grip` table keeps for them: a stream's keep-alive, a long-poll's deadline, timeout
//! answer and backend headers ([`CarriedGrip`]). The format is
//! [`clarion_proto::handover_grip`].
//!
//! What stays and is told to reconnect, with its reason ([`Fallback`]):
//! - a request forwarded to the backend and not answered yet (`State::Proxy`, or a WebSocket
//!   upgrade waiting for the backend's OPEN): `grip_backend`. The backend answers on the old
//!   process's connection to it; the request is not replayed, as it may not be idempotent.
//! - a WebSocket bridged with WebSocket-over-HTTP: `grip_bridge`. Its session lives in the
//!   backend's event requests (one may be in flight, events wait behind it, the backend's
//!   meta and keep-alive interval), whose answers come back to the old process.

use std::sync::Arc;

use super::grip::carried::CarriedGrip;
use super::grip::conn::{GripConn, KeepAlive, Phase, ResponseHold};
use super::handover::Fallback;
use super::socket::Socket;
use super::state::{State, WsMode, WsRole};
use super::Engine;

impl<S: Socket> Engine<S> {
    /// Why a connection in `state` forwarded to a GRIP backend cannot move; `None` when its
    /// state allows it (what its hold needs is `Side::blocker`'s to say).
    pub(super) fn grip_blocker(&self, state: State) -> Option<Fallback> {
        match state {
            State::Proxy => Some(Fallback::GripBackend),
            State::Ws(WsMode {
                role: WsRole::Bridge,
                ..
            }) => Some(Fallback::GripBridge),
            State::Http
            | State::Ws(_)
            | State::Sse(_)
            | State::Stream(_)
            | State::Poll(_)
            | State::H2
            | State::Closing { .. } => None,
        }
    }

    /// Takes what the `grip` table keeps for `k`, about to move (quietly: the backend is not
    /// told anything, the hold continues in the new process). Before the release, which
    /// forgets it. `None` for a held stream without a keep-alive, or a connection GRIP does
    /// not hold.
    pub(super) fn take_grip(&mut self, k: u32) -> Option<CarriedGrip> {
        let movable = matches!(
            self.side.grip().get(&k).map(|g| &g.phase),
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
        } = self.side.grip_mut().remove(&k)?;
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
        self.side.grip_mut().insert(
            k,
            GripConn {
                ticket,
                route: 0,
                phase,
            },
        );
    }
}
