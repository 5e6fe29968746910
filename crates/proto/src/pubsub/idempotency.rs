//! Idempotent publishing: the `Idempotency-Key` a publisher sends with a message, and the
//! table that remembers, for a window, which `(topic, key)` pairs were published and the id
//! each got. A publish repeated with a remembered key is answered the first one's id and not
//! delivered again (`docs/protocol.md`, "Idempotent publishing").
//!
//! Pure: the caller passes the time in ([`Remembered::claim`] takes `now`), so the table is
//! tested here without a clock. The in-memory broker (and the NATS broker, per node) keep one;
//! the Redis broker keeps the same promise in Redis itself, inside its publish script.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Longest key accepted, in bytes. A UUID is 36; 128 leaves room for a publisher's own
/// prefix (`order-123:attempt`) and bounds what one remembered publish costs.
pub const MAX_KEY_LEN: usize = 128;

/// Why an `Idempotency-Key` was refused (answered `400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The header is present but empty.
    #[error("Idempotency-Key is empty")]
    Empty,
    /// Longer than [`MAX_KEY_LEN`].
    #[error("Idempotency-Key is {0} bytes, longer than {MAX_KEY_LEN}")]
    TooLong(usize),
    /// A byte outside visible ASCII (`!` to `~`): keys are opaque tokens, and one that could
    /// hold spaces or control bytes would be logged or stored ambiguously.
    #[error("Idempotency-Key holds a byte outside visible ASCII (! to ~) at {0}")]
    Byte(usize),
}

/// Checks a key: 1 to [`MAX_KEY_LEN`] bytes of visible ASCII.
pub fn validate_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong(key.len()));
    }
    match key.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
        Some(i) => Err(KeyError::Byte(i)),
        None => Ok(()),
    }
}

/// What a remembered key answers a repeat with: the first publish's id and, when it was an
/// appendable message's fragment, that fragment's stream, `seq` and whether it closed it.
///
/// Kept as one line of words separated by spaces (ids, stream ids and keys hold none):
/// `ID` for a message, `ID STREAM SEQ DONE` (`DONE` `1` or `0`) for a fragment. In Redis the
/// id is written `EPOCH OFFSET` (two words): [`Recorded::parse_redis`] reads that form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The first publish's id.
    pub id: String,
    /// A fragment's stream, `seq` and `done`; `None` for a message.
    pub fragment: Option<(String, u32, bool)>,
}

impl Recorded {
    /// The record of a fragment, as [`Remembered::remember`] keeps it.
    pub fn fragment_line(id: &str, stream: &str, seq: u32, done: bool) -> String {
        format!("{id} {stream} {seq} {}", u8::from(done))
    }

    /// Reads a record kept in the process (`ID` or `ID STREAM SEQ DONE`). A line in neither
    /// form answers its first word as a message's id.
    pub fn parse(line: &str) -> Recorded {
        let mut w = line.split(' ');
        let id = w.next().unwrap_or_default().to_owned();
        Recorded {
            id,
            fragment: Self::fragment_of(w),
        }
    }

    /// Reads a record kept in Redis (`EPOCH OFFSET` or `EPOCH OFFSET STREAM SEQ DONE`).
    pub fn parse_redis(line: &str) -> Recorded {
        let mut w = line.split(' ');
        let epoch = w.next().unwrap_or_default();
        let offset = w.next().unwrap_or("0");
        Recorded {
            id: format!("{epoch}-{offset}"),
            fragment: Self::fragment_of(w),
        }
    }

    fn fragment_of<'a>(mut w: impl Iterator<Item = &'a str>) -> Option<(String, u32, bool)> {
        let stream = w.next()?;
        let seq = w.next()?.parse().ok()?;
        let done = w.next()? == "1";
        Some((stream.to_owned(), seq, done))
    }
}

/// What [`Remembered::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Not seen within the window: publish, then [`Remembered::remember`] the id.
    Fresh,
    /// Published before within the window, with this id: answer it, deliver nothing.
    Repeat(String),
}

/// `(topic, key)` pairs published within the window, with their ids, bounded in number (past
/// the bound the oldest goes first, early).
#[derive(Debug)]
pub struct Remembered {
    window: Duration,
    capacity: usize,
    ids: HashMap<(Box<str>, Box<str>), String>,
    /// Keys in the order they were remembered, with their expiry: the window is the same for
    /// every key, so this is also expiry order and the front is the next to go.
    expiry: VecDeque<(Instant, Box<str>, Box<str>)>,
}

impl Remembered {
    /// A table remembering keys for `window`, at most `capacity` at once.
    pub fn new(window: Duration, capacity: usize) -> Remembered {
        Remembered {
            window,
            capacity,
            ids: HashMap::new(),
            expiry: VecDeque::new(),
        }
    }

    /// Looks `(topic, key)` up at `now`, forgetting the keys whose window has passed first.
    pub fn claim(&mut self, now: Instant, topic: &str, key: &str) -> Claim {
        self.expire(now);
        match self.ids.get(&(topic.into(), key.into())) {
            Some(id) => Claim::Repeat(id.clone()),
            None => Claim::Fresh,
        }
    }

    /// Records that `(topic, key)` was published at `now` with `id`. A key already held keeps
    /// its first id (the caller claims before publishing, so this does not happen in use).
    /// At `capacity`, the oldest key is forgotten before its window ends (so a publisher
    /// that sets a key on every publish cannot make publishing fail); returns how many were,
    /// for the caller to count.
    pub fn remember(&mut self, now: Instant, topic: &str, key: &str, id: &str) -> usize {
        let k: (Box<str>, Box<str>) = (topic.into(), key.into());
        if self.ids.contains_key(&k) {
            return 0;
        }
        let mut early = 0;
        while self.ids.len() >= self.capacity.max(1) {
            match self.expiry.pop_front() {
                Some((_, topic, key)) => {
                    self.ids.remove(&(topic, key));
                    early += 1;
                }
                None => break,
            }
        }
        self.ids.insert(k.clone(), id.to_owned());
        self.expiry.push_back((now + self.window, k.0, k.1));
        early
    }

    /// Keys remembered now (expired ones included until the next claim).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _, _)) = self.expiry.front() {
            if *at > now {
                break;
            }
            if let Some((_, topic, key)) = self.expiry.pop_front() {
                self.ids.remove(&(topic, key));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_128_visible_ascii_bytes() {
        assert_eq!(validate_key("3f2a-9c"), Ok(()));
        assert_eq!(validate_key(&"k".repeat(MAX_KEY_LEN)), Ok(()));
        assert_eq!(validate_key(""), Err(KeyError::Empty));
        assert_eq!(
            validate_key(&"k".repeat(MAX_KEY_LEN + 1)),
            Err(KeyError::TooLong(129))
        );
        assert_eq!(validate_key("a b"), Err(KeyError::Byte(1)));
        assert_eq!(validate_key("é"), Err(KeyError::Byte(0)));
        assert_eq!(validate_key("a\tb"), Err(KeyError::Byte(1)));
    }

    #[test]
    fn a_key_repeated_within_the_window_answers_the_first_id() {
        let t0 = Instant::now();
        let mut r = Remembered::new(Duration::from_secs(300), 10);
        assert_eq!(r.claim(t0, "news", "k1"), Claim::Fresh);
        assert_eq!(r.remember(t0, "news", "k1", "e-1"), 0);
        let later = t0 + Duration::from_secs(299);
        assert_eq!(r.claim(later, "news", "k1"), Claim::Repeat("e-1".into()));
        // A key is scoped to its topic.
        assert_eq!(r.claim(later, "sport", "k1"), Claim::Fresh);
    }

    #[test]
    fn a_key_is_forgotten_when_its_window_ends() {
        let t0 = Instant::now();
        let mut r = Remembered::new(Duration::from_secs(300), 10);
        assert_eq!(r.remember(t0, "news", "k1", "e-1"), 0);
        assert_eq!(
            r.remember(t0 + Duration::from_secs(10), "news", "k2", "e-2"),
            0
        );
        let end = t0 + Duration::from_secs(300);
        assert_eq!(r.claim(end, "news", "k1"), Claim::Fresh);
        assert_eq!(r.len(), 1);
        assert_eq!(r.claim(end, "news", "k2"), Claim::Repeat("e-2".into()));
    }

    #[test]
    fn a_full_table_forgets_its_oldest_key_early_and_says_so() {
        let t0 = Instant::now();
        let mut r = Remembered::new(Duration::from_secs(60), 2);
        assert_eq!(r.remember(t0, "t", "a", "e-1"), 0);
        assert_eq!(r.remember(t0, "t", "b", "e-2"), 0);
        assert_eq!(r.remember(t0, "t", "c", "e-3"), 1);
        assert_eq!(r.len(), 2);
        assert_eq!(r.claim(t0, "t", "a"), Claim::Fresh);
        assert_eq!(r.claim(t0, "t", "b"), Claim::Repeat("e-2".into()));
        assert_eq!(r.claim(t0, "t", "c"), Claim::Repeat("e-3".into()));
        assert!(!r.is_empty());
    }

    #[test]
    fn remembering_a_held_key_again_keeps_its_first_id() {
        let t0 = Instant::now();
        let mut r = Remembered::new(Duration::from_secs(60), 4);
        assert_eq!(r.remember(t0, "t", "a", "e-1"), 0);
        assert_eq!(r.remember(t0, "t", "a", "e-9"), 0);
        assert_eq!(r.claim(t0, "t", "a"), Claim::Repeat("e-1".into()));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn records_keep_a_fragments_answer_and_a_messages_id() {
        let line = Recorded::fragment_line("e-7", "e-3", 4, true);
        assert_eq!(line, "e-7 e-3 4 1");
        let r = Recorded::parse(&line);
        assert_eq!(r.id, "e-7");
        assert_eq!(r.fragment, Some(("e-3".to_owned(), 4, true)));
        assert_eq!(Recorded::parse("e-9").fragment, None);
        assert_eq!(Recorded::parse("e-9").id, "e-9");
        // Redis spells the id in two words.
        let r = Recorded::parse_redis("ab 12 ab-10 3 0");
        assert_eq!(r.id, "ab-12");
        assert_eq!(r.fragment, Some(("ab-10".to_owned(), 3, false)));
        assert_eq!(Recorded::parse_redis("ab 12").fragment, None);
        // A cut record answers as a message rather than inventing a stream.
        assert_eq!(Recorded::parse("e-7 e-3").fragment, None);
    }
}
