//! Graceful shutdown of the connections: each is ended the way its transport allows a client
//! to resume (WebSockets close with 1001, SSE and streams end, held long-polls are answered
//! empty, GRIP holds get their backend's answers).
//!
//! The listeners and the shutdown deadline belong to the shell in [`super`].

use std::sync::Arc;

use super::socket::Socket;
use super::state::State;
use super::Engine;
use crate::metrics::CloseReason;
use crate::worker::transport::poll::messages_body;

impl<S: Socket> Engine<S> {
    /// Starts closing every connection the way its transport allows the client to resume.
    pub(crate) fn begin_shutdown(&mut self) {
        let keys: Vec<(u32, State)> = self
            .conns
            .iter()
            .map(|(k, c)| (k as u32, c.state))
            .collect();
        for (k, state) in keys {
            // The one dispatch on a connection's role at shutdown.
            match state {
                s if s.grip_held() => self.grip_shutdown(k),
                State::Ws(_) => self.close_ws(
                    k,
                    clarion_proto::ws::CloseCode::GoingAway,
                    "server shutting down",
                    CloseReason::Shutdown,
                ),
                // The client reconnects (EventSource does so by itself) and resumes by id.
                State::Sse(_) => self.start_closing(k, None, CloseReason::Shutdown),
                State::Stream(_) => {
                    let last: Arc<[u8]> = Arc::from(clarion_proto::http1::LAST_CHUNK);
                    self.start_closing(k, Some(last), CloseReason::Shutdown);
                }
                State::Poll(_) => {
                    let cursor = self.polls.get(&k).map(|h| h.cursor.clone());
                    let body = messages_body(std::iter::empty(), &cursor.unwrap_or_default(), &[]);
                    self.answer_poll(k, &Arc::from(body));
                }
                State::Http | State::Proxy => self.drop_conn(k, CloseReason::Shutdown),
                State::Closing { .. } => {}
            }
        }
    }
}
