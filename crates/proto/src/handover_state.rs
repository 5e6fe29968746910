//! The part of a hand-over connection record ([`crate::handover::ConnRecord`]) that carries
//! what the modes keep per connection beside the slab: its token's rights and deadline
//! (authentication, or the grants a `connect` hook gave), who the backend's hooks were told it
//! is, and its part in presence rooms. With it the new process serves the connection as the
//! old one did: the same rights until the same wall-clock deadline, no `disconnected` /
//! `connected` webhook, no presence `leave` / `join`.
//!
//! Pure functions over bytes, kept apart from the record's transport fields so that other
//! additions to the record do not touch this section. The section is length-prefixed inside
//! the record; the decoder checks every length against what is left, refuses non-canonical
//! bytes (a flag other than 0 or 1), and never panics.
//!
//! ```text
//! AUTH?     flag | deadline (u64 LE, Unix seconds) | pending flag | warned flag
//!                | n (u16) patterns it may subscribe to (str each)
//!                | n (u16) patterns it may publish to (str each)
//! HOOKS?    flag | ident? (flag | sub? | info?) | live? (flag | conn str | sub? | age u32)
//! PRESENCE? flag | ident? (flag | sub str | info?)
//!                | n (u16) rooms: name str, room version u64
//!                | n (u16) rooms it listens to: name str, version its list was read at u64
//! FILTERS   absent, or 1 | n (u16, at least 1) subscription filters: topic str, filter str
//!           (canonical text, `docs/filters.md`)
//! PUSHER    absent, or 2 | app key str | socket id (u64 LE, u64 LE) | user?
//!                | n (u16) presence memberships: channel str, user id str
//! ```
//!
//! The filters and Pusher parts are trailing parts, each absent when the connection holds
//! none and told apart by its leading tag (1, 2, in that order), so a section written before
//! either existed reads the same.
//!
//! (`str` is a u32 LE length and UTF-8 bytes: an `info` may be as long as its limit is set;
//! `x?` is a flag byte followed by `x` when the flag is 1; `sub?`, `info?` are optional strs.)

use crate::handover_cursor::{Error, Reader};

/// A connection's authentication: what its token (or a `connect` hook) grants, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthState<'a> {
    /// The Unix second from which the token no longer counts (leeway included), or by which a
    /// pending connection must authenticate.
    pub deadline: u64,
    /// The connection has not authenticated yet (anonymous access is off).
    pub pending: bool,
    /// The expiry warning was sent for the current token.
    pub warned: bool,
    /// Topic patterns it may subscribe to (as a token's `clarion` claim writes them).
    pub subscribe: Vec<&'a str>,
    /// Topic patterns it may publish to.
    pub publish: Vec<&'a str>,
}

/// Who the backend's hooks know a connection as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookState<'a> {
    /// The identity a `connect` hook returned: `sub` and `info`, either may be absent.
    pub ident: Option<(Option<&'a str>, Option<&'a str>)>,
    /// The `connected` webhook was sent for it: the connection id it was given, the `sub` it
    /// named, and the seconds since (for the `disconnected` event's duration).
    pub live: Option<HookLive<'a>>,
}

/// A connection the webhook was told about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookLive<'a> {
    /// The connection id in the `connected` event.
    pub conn: &'a str,
    /// The `sub` in it.
    pub sub: Option<&'a str>,
    /// Seconds since it was accepted.
    pub age: u32,
}

/// A connection's part in presence rooms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceState<'a> {
    /// The identity it is a member under (`sub`, `info`); `None`: counted, not listed.
    pub ident: Option<(&'a str, Option<&'a str>)>,
    /// The rooms it is in, each with the room's version when the connection moved.
    pub rooms: Vec<(&'a str, u64)>,
    /// The rooms whose events it receives, each with the version its member list was read at
    /// (later events are the ones it has not seen in a list).
    pub listening: Vec<(&'a str, u64)>,
}

/// A Pusher connection's own part (`docs/pusher.md`): what its client was told and signed
/// with, which the new process must keep answering to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PusherState<'a> {
    /// Its application's key (the new process looks the application up by it).
    pub app_key: &'a str,
    /// Its socket id's two numbers (`high.low`), as `pusher:connection_established` gave it.
    pub socket_id: (u64, u64),
    /// The user it signed in as.
    pub user: Option<&'a str>,
    /// Its presence memberships: channel, the user id it joined as.
    pub members: Vec<(&'a str, &'a str)>,
}

/// Everything the modes keep for one connection; each part is absent when that mode keeps
/// nothing for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModeState<'a> {
    /// Authentication.
    pub auth: Option<AuthState<'a>>,
    /// Backend hooks.
    pub hooks: Option<HookState<'a>>,
    /// Presence.
    pub presence: Option<PresenceState<'a>>,
    /// Subscription filters: topic, filter in its canonical text.
    pub filters: Vec<(&'a str, &'a str)>,
    /// A Pusher connection's own part.
    pub pusher: Option<PusherState<'a>>,
}

/// Why a state section is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed connection state section")]
pub struct Malformed;

impl ModeState<'_> {
    /// Whether no mode keeps anything.
    pub fn is_empty(&self) -> bool {
        self.auth.is_none()
            && self.hooks.is_none()
            && self.presence.is_none()
            && self.filters.is_empty()
            && self.pusher.is_none()
    }
}

/// Appends `m`'s encoding to `out`. Lists and strings beyond their field's width are cut to it
/// (the server's own limits keep them far below).
pub fn encode(m: &ModeState<'_>, out: &mut Vec<u8>) {
    match &m.auth {
        None => out.push(0),
        Some(a) => {
            out.push(1);
            out.extend_from_slice(&a.deadline.to_le_bytes());
            out.extend_from_slice(&[u8::from(a.pending), u8::from(a.warned)]);
            put_list(out, &a.subscribe);
            put_list(out, &a.publish);
        }
    }
    match &m.hooks {
        None => out.push(0),
        Some(h) => {
            out.push(1);
            match h.ident {
                None => out.push(0),
                Some((sub, info)) => {
                    out.push(1);
                    put_opt(out, sub);
                    put_opt(out, info);
                }
            }
            match &h.live {
                None => out.push(0),
                Some(l) => {
                    out.push(1);
                    put_str(out, l.conn);
                    put_opt(out, l.sub);
                    out.extend_from_slice(&l.age.to_le_bytes());
                }
            }
        }
    }
    match &m.presence {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            match p.ident {
                None => out.push(0),
                Some((sub, info)) => {
                    out.push(1);
                    put_str(out, sub);
                    put_opt(out, info);
                }
            }
            put_versions(out, &p.rooms);
            put_versions(out, &p.listening);
        }
    }
    if !m.filters.is_empty() {
        out.push(1);
        let n = m.filters.len().min(65535);
        out.extend_from_slice(&(n as u16).to_le_bytes());
        for (topic, filter) in m.filters.iter().take(n) {
            put_str(out, topic);
            put_str(out, filter);
        }
    }
    if let Some(p) = &m.pusher {
        out.push(2);
        put_str(out, p.app_key);
        out.extend_from_slice(&p.socket_id.0.to_le_bytes());
        out.extend_from_slice(&p.socket_id.1.to_le_bytes());
        put_opt(out, p.user);
        let n = p.members.len().min(65535);
        out.extend_from_slice(&(n as u16).to_le_bytes());
        for (channel, user_id) in p.members.iter().take(n) {
            put_str(out, channel);
            put_str(out, user_id);
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // A string longer than 4 GiB cannot come from a token or a hook answer (both bounded far
    // below); cut, it would fail to decode rather than mean something else.
    let b = s
        .as_bytes()
        .get(..s.len().min(u32::MAX as usize))
        .unwrap_or_default();
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(0),
        Some(s) => {
            out.push(1);
            put_str(out, s);
        }
    }
}

fn put_list(out: &mut Vec<u8>, list: &[&str]) {
    let n = list.len().min(65535);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for s in list.iter().take(n) {
        put_str(out, s);
    }
}

fn put_versions(out: &mut Vec<u8>, list: &[(&str, u64)]) {
    let n = list.len().min(65535);
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for (s, v) in list.iter().take(n) {
        put_str(out, s);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Decodes a whole section: every byte of `buf` must belong to it.
pub fn decode(buf: &[u8]) -> Result<ModeState<'_>, Malformed> {
    let mut r = Reader {
        buf,
        what: "mode state",
    };
    decode_from(&mut r).map_err(|_| Malformed)
}

fn decode_from<'a>(r: &mut Reader<'a>) -> Result<ModeState<'a>, Error> {
    let auth = if r.flag()? {
        Some(AuthState {
            deadline: r.u64()?,
            pending: r.flag()?,
            warned: r.flag()?,
            subscribe: r.list()?,
            publish: r.list()?,
        })
    } else {
        None
    };
    let hooks = if r.flag()? {
        let ident = if r.flag()? {
            Some((r.opt()?, r.opt()?))
        } else {
            None
        };
        let live = if r.flag()? {
            Some(HookLive {
                conn: r.str()?,
                sub: r.opt()?,
                age: r.u32()?,
            })
        } else {
            None
        };
        Some(HookState { ident, live })
    } else {
        None
    };
    let presence = if r.flag()? {
        let ident = if r.flag()? {
            Some((r.str()?, r.opt()?))
        } else {
            None
        };
        Some(PresenceState {
            ident,
            rooms: r.versions()?,
            listening: r.versions()?,
        })
    } else {
        None
    };
    let mut filters = Vec::new();
    if r.buf.first() == Some(&1) {
        r.u8()?;
        // Present only when there is one at least: one encoding per state.
        let n = usize::from(r.u16()?);
        if n == 0 {
            return Err(Error::Trailing(r.what));
        }
        filters.reserve(n.min(r.buf.len() / 8));
        for _ in 0..n {
            filters.push((r.str()?, r.str()?));
        }
    }
    let mut pusher = None;
    if r.buf.first() == Some(&2) {
        r.u8()?;
        let app_key = r.str()?;
        let socket_id = (r.u64()?, r.u64()?);
        let user = r.opt()?;
        let n = usize::from(r.u16()?);
        let mut members = Vec::with_capacity(n.min(r.buf.len() / 8));
        for _ in 0..n {
            members.push((r.str()?, r.str()?));
        }
        pusher = Some(PusherState {
            app_key,
            socket_id,
            user,
            members,
        });
    }
    if !r.buf.is_empty() {
        return Err(Error::Trailing(r.what));
    }
    Ok(ModeState {
        auth,
        hooks,
        presence,
        filters,
        pusher,
    })
}

/// The section's own fields, read with the hand-over frames' cursor (which fails, never
/// panics, when a field runs past the end).
impl<'a> Reader<'a> {
    fn str(&mut self) -> Result<&'a str, Error> {
        let n = self.u32()? as usize;
        self.str_of(n)
    }

    fn opt(&mut self) -> Result<Option<&'a str>, Error> {
        if self.flag()? {
            self.str().map(Some)
        } else {
            Ok(None)
        }
    }

    fn list(&mut self) -> Result<Vec<&'a str>, Error> {
        let n = usize::from(self.u16()?);
        // Each entry takes at least 4 bytes: a count beyond that is a lie, not a size to
        // reserve.
        let mut v = Vec::with_capacity(n.min(self.buf.len() / 4));
        for _ in 0..n {
            v.push(self.str()?);
        }
        Ok(v)
    }

    fn versions(&mut self) -> Result<Vec<(&'a str, u64)>, Error> {
        let n = usize::from(self.u16()?);
        let mut v = Vec::with_capacity(n.min(self.buf.len() / 12));
        for _ in 0..n {
            v.push((self.str()?, self.u64()?));
        }
        Ok(v)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// A state with every part present, and each optional field both ways across the parts.
    pub(crate) fn full() -> ModeState<'static> {
        ModeState {
            auth: Some(AuthState {
                deadline: 1_790_000_000,
                pending: false,
                warned: true,
                subscribe: vec!["chat.*", "news"],
                publish: vec!["chat.lobby"],
            }),
            hooks: Some(HookState {
                ident: Some((Some("u42"), None)),
                live: Some(HookLive {
                    conn: "ab12-c7",
                    sub: Some("u42"),
                    age: 31,
                }),
            }),
            presence: Some(PresenceState {
                ident: Some(("u42", Some(r#"{"name":"Ann"}"#))),
                rooms: vec![("room.a", 7), ("room.b", 0)],
                listening: vec![("room.a", 5)],
            }),
            filters: Vec::new(),
            pusher: None,
        }
    }

    /// A Pusher connection's part with every field set.
    pub(crate) fn pusher() -> PusherState<'static> {
        PusherState {
            app_key: "app1-key",
            socket_id: (1_234_567_890, 42),
            user: Some("u42"),
            members: vec![("presence-room", "u42"), ("presence-b", "u42")],
        }
    }

    #[test]
    fn the_pusher_part_rides_after_the_filters_and_a_section_without_it_is_unchanged() {
        let mut m = full();
        m.filters = vec![("prices", "sym == \"A\"")];
        let mut before = Vec::new();
        encode(&m, &mut before);
        m.pusher = Some(pusher());
        let mut buf = Vec::new();
        encode(&m, &mut buf);
        assert!(
            buf.starts_with(&before),
            "older parts are written as before"
        );
        assert_eq!(decode(&buf), Ok(m.clone()));
        for cut in before.len() + 1..buf.len() {
            assert_eq!(decode(&buf[..cut]), Err(Malformed), "cut at {cut}");
        }
        // Alone, without a user or memberships, and without filters before it.
        let alone = ModeState {
            pusher: Some(PusherState {
                user: None,
                members: vec![],
                ..pusher()
            }),
            ..ModeState::default()
        };
        assert!(!alone.is_empty());
        let mut b = Vec::new();
        encode(&alone, &mut b);
        assert_eq!(decode(&b), Ok(alone));
        // The parts come in their order only: a Pusher part before the filters is refused.
        let mut swapped = vec![0, 0, 0];
        let mut p = Vec::new();
        encode(
            &ModeState {
                pusher: Some(pusher()),
                ..ModeState::default()
            },
            &mut p,
        );
        swapped.extend_from_slice(&p[3..]);
        swapped.extend_from_slice(&[1, 1, 0, 1, 0, 0, 0, b't', 1, 0, 0, 0, b'f']);
        assert_eq!(decode(&swapped), Err(Malformed));
        // An unknown part's tag is refused.
        assert_eq!(decode(&[0, 0, 0, 3]), Err(Malformed));
    }

    #[test]
    fn filters_ride_last_and_a_section_without_them_is_unchanged() {
        let mut m = full();
        let mut before = Vec::new();
        encode(&m, &mut before);
        m.filters = vec![("prices", "sym in [\"A\", \"B\"]"), ("b", "x == \"1\"")];
        let mut buf = Vec::new();
        encode(&m, &mut buf);
        assert!(
            buf.starts_with(&before),
            "the older parts are written as before"
        );
        assert_eq!(decode(&buf), Ok(m.clone()));
        assert!(!ModeState {
            filters: vec![("t", "a == \"1\"")],
            ..ModeState::default()
        }
        .is_empty());
        for cut in before.len() + 1..buf.len() {
            assert_eq!(decode(&buf[..cut]), Err(Malformed), "cut at {cut}");
        }
        // An empty filters part (flag and a count of 0) is not an encoding of anything.
        let mut empty = before.clone();
        empty.extend_from_slice(&[1, 0, 0]);
        assert_eq!(decode(&empty), Err(Malformed));
    }

    #[test]
    fn every_part_round_trips_alone_and_together() {
        let f = full();
        let cases = [
            ModeState::default(),
            f.clone(),
            ModeState {
                auth: Some(AuthState {
                    deadline: 9,
                    pending: true,
                    warned: false,
                    subscribe: vec![],
                    publish: vec![],
                }),
                ..ModeState::default()
            },
            ModeState {
                hooks: Some(HookState {
                    ident: Some((None, Some("{}"))),
                    live: None,
                }),
                ..ModeState::default()
            },
            ModeState {
                presence: Some(PresenceState {
                    ident: None,
                    rooms: vec![("r", u64::MAX)],
                    listening: vec![],
                }),
                ..ModeState::default()
            },
        ];
        for m in cases {
            let mut buf = Vec::new();
            encode(&m, &mut buf);
            assert_eq!(decode(&buf), Ok(m.clone()));
            assert_eq!(m.is_empty(), buf == [0, 0, 0]);
            // Every cut is refused, never read past.
            for cut in 0..buf.len() {
                assert_eq!(decode(&buf[..cut]), Err(Malformed), "cut at {cut}");
            }
            // A byte more is refused.
            buf.push(0);
            assert_eq!(decode(&buf), Err(Malformed));
        }
    }

    #[test]
    fn an_info_longer_than_64_kib_round_trips() {
        let info = format!("{{\"bio\":\"{}\"}}", "x".repeat(70_000));
        let m = ModeState {
            hooks: Some(HookState {
                ident: Some((Some("u"), Some(&info))),
                live: None,
            }),
            ..ModeState::default()
        };
        let mut buf = Vec::new();
        encode(&m, &mut buf);
        assert_eq!(decode(&buf), Ok(m));
    }

    #[test]
    fn lying_counts_flags_and_bytes_fail_cleanly() {
        let mut buf = Vec::new();
        encode(&full(), &mut buf);
        for i in 0..buf.len() {
            for v in [0u8, 1, 2, 0x7f, 0xff] {
                let mut b = buf.clone();
                b[i] = v;
                if let Ok(m) = decode(&b) {
                    // Whatever decodes re-encodes to the same bytes (one encoding per state).
                    let mut again = Vec::new();
                    encode(&m, &mut again);
                    assert_eq!(again, b);
                }
            }
        }
        assert_eq!(decode(&[2, 0, 0]), Err(Malformed), "a flag is 0 or 1");
        // A list announcing 65,535 patterns with none there.
        let mut b = vec![1];
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&[0, 0, 0xff, 0xff]);
        assert_eq!(decode(&b), Err(Malformed));
        // A pattern that is not UTF-8.
        let mut b = vec![1];
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&[0, 0, 1, 0, 1, 0, 0, 0, 0xff, 0, 0, 0, 0]);
        assert_eq!(decode(&b), Err(Malformed));
        let last = b.len() - 5;
        b[last] = b'x';
        assert!(
            decode(&b).is_ok(),
            "the same bytes with a valid pattern decode"
        );
    }
}
