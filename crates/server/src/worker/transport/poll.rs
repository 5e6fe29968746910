//! Long-polling: a request held until a message arrives on one of its topics or its deadline
//! passes, then answered with `{"messages":[...],"cursor":...}` and returned to `Http` (or
//! closed). A held poll pays for one side entry (its deadline and cursor), not the record.
#![deny(clippy::wildcard_enum_match_arm)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use clarion_proto::http1;
/// The long-poll body writer (`{"messages":[...],"cursor":...}`), shared with the sweep and
/// shutdown, which answer held polls empty.
pub(crate) use clarion_proto::pubsub::poll_body as messages_body;

use crate::broker::{Since, Subscribed};
use crate::metrics::CloseReason;
use crate::worker::filters::keep_passing;
use crate::worker::socket::Socket;
use crate::worker::state::{PollMode, State};
use crate::worker::Engine;
use clarion_proto::filter::Filter;

/// How a long-poll asked to wait: seconds to hold, whether its answers carry presence, and
/// the filter its messages must pass (`docs/filters.md`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PollWait<'f> {
    pub(crate) hold: u32,
    pub(crate) presence: bool,
    pub(crate) filter: Option<&'f Filter>,
}

/// A long-poll being held: when it expires, and the cursor its empty answer carries.
pub(crate) struct PollHold {
    pub(crate) deadline: u32,
    pub(crate) cursor: String,
    /// The answer carries the member lists of the poll's presence topics (`presence=1`), and
    /// a `join` or `leave` in one of them answers it.
    pub(crate) presence: bool,
}

impl<S: Socket> Engine<S> {
    /// Starts a long-poll: answers at once when something was missed, else holds the request.
    pub(crate) fn open_poll(
        &mut self,
        k: u32,
        topics: &[&str],
        since: Since<'_>,
        wait: PollWait<'_>,
        mode: PollMode,
        checked: crate::worker::transport::auth::Checked,
    ) {
        let PollWait {
            hold,
            presence,
            filter,
        } = wait;
        if self.set_state(k, State::Poll(mode)).is_none() {
            return;
        }
        self.adopt(k, checked);
        let Some(mut sub) = self.subscribe_filtered(k, topics, since, false, filter) else {
            return;
        };
        // The cursor moves past what the filter leaves out (no gap: not for this poll).
        let cursor = poll_cursor(&sub);
        keep_passing(filter, &mut sub.replay);
        // A first presence poll (no position yet) is answered at once with the member lists;
        // later ones wait for a message or a change.
        let first_look = presence && matches!(since, Since::Now);
        let now = !sub.replay.is_empty() || !sub.gaps.is_empty() || hold == 0 || first_look;
        let body = now.then(|| poll_body_at(&sub, &cursor));
        self.side.polls_mut().insert(
            k,
            PollHold {
                deadline: self.now.saturating_add(hold),
                cursor: sub.position,
                presence,
            },
        );
        if let Some(body) = body {
            self.answer_poll(k, &Arc::from(body));
        } else if presence {
            // Held until a message or a change of its rooms: their events are wanted.
            self.presence_poll_watch(k, &sub.names, true);
        }
    }

    /// Answers held long-poll `k` with no message, at its cursor (it asks again from there):
    /// at shutdown, and when its rooms changed.
    pub(crate) fn answer_poll_empty(&mut self, k: u32) {
        let cursor = self.side.polls().get(&k).map(|h| h.cursor.clone());
        let body = messages_body(std::iter::empty(), &cursor.unwrap_or_default(), &[]);
        self.answer_poll(k, &Arc::from(body));
    }

    /// Answers a held long-poll with `body` (JSON) and returns the connection to `Http` (or
    /// closes it): it leaves its topics, since the next poll says where to resume.
    pub(crate) fn answer_poll(&mut self, k: u32, body: &Arc<[u8]>) {
        let presence = self.side.polls().get(&k).is_some_and(|h| h.presence);
        let with_presence = presence.then(|| self.presence_in_poll(k, body));
        if presence {
            self.presence_poll_watch(k, &[], false);
        }
        let body = with_presence.as_ref().unwrap_or(body);
        self.leave_all_topics(k);
        self.side.polls_mut().remove(&k);
        // The next request on this connection brings its own token.
        self.side.grants_mut().clear(k);
        let Some(conn) = self.conns.get_mut(k as usize) else {
            return;
        };
        let State::Poll(mode) = conn.state else {
            return;
        };
        let keep = mode.keep && !self.shared.stopping.load(Relaxed);
        conn.last_seen = self.now;
        self.set_state(k, State::Http);
        let origin = self.shared.config.cors_allow_origin.as_str();
        let mut headers: Vec<(&str, &str)> = vec![
            ("Content-Type", "application/json"),
            ("Cache-Control", "no-store"),
        ];
        if !origin.is_empty() {
            headers.push(("Access-Control-Allow-Origin", origin));
        }
        if !keep {
            headers.push(("Connection", "close"));
        }
        let mut head = Vec::with_capacity(256);
        http1::write_response_head(&mut head, 200, &headers, Some(body.len()));
        let head: Arc<[u8]> = head.into();
        self.write_all_to(k, &[&head, body], None);
        if !keep {
            self.start_closing(k, None, CloseReason::HttpDone);
        }
    }
}

/// The long-poll answer for what a subscription found: `{"messages":[...],"cursor":..}` plus
/// `"gaps"` when the resume was incomplete.
/// The cursor after a subscription's replay: its position, moved to each replayed message.
pub(crate) fn poll_cursor(sub: &Subscribed) -> String {
    let mut cursor = sub.position.clone();
    for m in &sub.replay {
        // A per-topic cursor (several topics of a clustered broker) moves one topic at a time.
        cursor = advance_cursor(&cursor, &m.topic, &m.id_string()).unwrap_or_else(|| m.id_string());
    }
    cursor
}

/// The answer at `cursor` ([`poll_cursor`], computed before a filter dropped messages from
/// the replay).
pub(crate) fn poll_body_at(sub: &Subscribed, cursor: &str) -> Vec<u8> {
    let gaps: Vec<String> = sub.gaps.iter().map(|g| g.json()).collect();
    messages_body(sub.replay.iter().map(|m| m.json()), cursor, &gaps)
}

/// A per-topic cursor (`topic:EPOCH-SEQ,...`, what a clustered broker gives a subscription to
/// several topics) with `topic`'s entry moved to `id`; `None` for a plain one-id cursor.
pub(crate) fn advance_cursor(cursor: &str, topic: &str, id: &str) -> Option<String> {
    if !cursor.contains(',') {
        return None;
    }
    let entries: Vec<String> = cursor
        .split(',')
        .map(|e| match e.rsplit_once(':') {
            Some((t, _)) if t == topic => format!("{t}:{id}"),
            _ => e.to_owned(),
        })
        .collect();
    Some(entries.join(","))
}
