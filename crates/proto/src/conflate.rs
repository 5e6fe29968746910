//! "Latest wins" conflation: a subscriber's bounded backlog that, once it is long, replaces a
//! queued message by a newer one with the same key instead of queueing both, and says how many
//! it skipped. Pure: the server owns one per slow subscriber of a conflating topic, feeds it
//! publications ([`ConflateQueue::push`]) and drains it as the socket accepts bytes
//! ([`ConflateQueue::poll`]); no clock, no socket here.
//!
//! **Where a newer message goes.** It takes the queued message's place (the key keeps the
//! position of its oldest queued message), rather than moving to the tail. A key updated faster
//! than the subscriber reads would, at the tail, be pushed back on every update and never reach
//! the head while the updates last; in place, it is delivered at most one backlog's length after
//! it was first queued, with the latest value at that moment. Order within a key is kept; order
//! across keys is not (a key's newer value may now precede another key's older one), which is
//! what "latest value per key" asks for.
//!
//! **Bounds.** Below `threshold` messages nothing is replaced (a subscriber keeping up sees
//! every update). At or above it, a message whose key is queued replaces it; any other message
//! is queued while the backlog is below `threshold + max_keys`, so memory is bounded by the
//! number of keys, not the message rate. A push past that bound is refused
//! ([`Push::Full`]): the server treats the subscriber as it treats any slow consumer. Messages
//! without a key (the pointer found nothing) are never replaced and count against the bound.
//!
//! **Notices.** A message that replaced others comes out of [`ConflateQueue::poll`] right after
//! a [`Notice`] with the number it replaced: distinct from a gap, since nothing the topic's rule
//! says matters was lost.

use std::collections::{HashMap, VecDeque};

/// Where a message's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A JSON pointer (RFC 6901) into the message, which must be JSON: the string, number or
    /// boolean there.
    Pointer(String),
    /// The publish request's `key` field.
    PublishField,
}

/// Longest key kept: longer ones make the message unkeyed (never replaced).
pub const MAX_KEY: usize = 256;

/// Why a publisher-given conflation key (`conflation_key`) is refused: the publish is answered
/// `400` with this text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PublishKeyError {
    /// An empty key would make every keyless publisher's messages one key.
    #[error("conflation_key is empty")]
    Empty,
    /// Longer than [`MAX_KEY`] bytes (UTF-8).
    #[error("conflation_key is {0} bytes, more than the {MAX_KEY} allowed")]
    TooLong(usize),
    /// A control character (a key is a name, and it is logged).
    #[error("conflation_key has a control character")]
    Control,
}

/// Checks a publisher-given conflation key: 1 to [`MAX_KEY`] bytes of UTF-8 without control
/// characters.
pub fn validate_publish_key(key: &str) -> Result<(), PublishKeyError> {
    if key.is_empty() {
        return Err(PublishKeyError::Empty);
    }
    if key.len() > MAX_KEY {
        return Err(PublishKeyError::TooLong(key.len()));
    }
    if key.chars().any(char::is_control) {
        return Err(PublishKeyError::Control);
    }
    Ok(())
}

/// Why a key source is refused in configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySourceError {
    /// A JSON pointer must be empty or start with `/`.
    #[error("conflation key {0:?} is not a JSON pointer (\"\" or starting with \"/\")")]
    NotAPointer(String),
}

impl KeySource {
    /// Reads a configured key: `field` for the publish field, otherwise a JSON pointer.
    pub fn parse(s: &str) -> Result<KeySource, KeySourceError> {
        if s == "field" {
            return Ok(KeySource::PublishField);
        }
        if !s.is_empty() && !s.starts_with('/') {
            return Err(KeySourceError::NotAPointer(s.chars().take(64).collect()));
        }
        Ok(KeySource::Pointer(s.to_owned()))
    }

    /// The key of one publication (computed once per publication, not per subscriber), or
    /// `None` when it has none: not JSON, nothing at the pointer, an object or array there, no
    /// publish field, or longer than [`MAX_KEY`].
    pub fn key_of(&self, payload: &[u8], publish_key: Option<&str>) -> Option<String> {
        let key = match self {
            KeySource::PublishField => publish_key.map(str::to_owned),
            KeySource::Pointer(p) => {
                let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
                match v.pointer(p)? {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Number(n) => Some(n.to_string()),
                    serde_json::Value::Bool(b) => Some(b.to_string()),
                    serde_json::Value::Null
                    | serde_json::Value::Array(_)
                    | serde_json::Value::Object(_) => None,
                }
            }
        }?;
        (key.len() <= MAX_KEY).then_some(key)
    }
}

/// What [`ConflateQueue::push`] did with a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Push<M> {
    /// Queued at the tail.
    Queued,
    /// Replaced the queued message with the same key (which is dropped, counted as skipped).
    Replaced,
    /// Refused: the backlog holds `threshold + max_keys` messages. The message is handed back.
    Full(M),
}

/// Told to the subscriber before the message that replaced others (more than one notice may
/// precede a message that was replaced again after the first was handed out: they add up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    /// Messages with the next message's key that it replaced (never delivered).
    pub skipped: u64,
}

/// What [`ConflateQueue::poll`] hands out, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Item<M> {
    /// Precedes the message it concerns.
    Conflated(Notice),
    /// A message to deliver.
    Message(M),
}

struct Entry<M> {
    key: Option<String>,
    message: M,
    /// Messages this one replaced.
    skipped: u64,
}

/// A subscriber's conflating backlog. See the module documentation for the rules.
pub struct ConflateQueue<M> {
    /// Entries in delivery order; `entries[i]` has position `front + i`.
    entries: VecDeque<Entry<M>>,
    /// Position of `entries[0]`: positions only grow, so a key's position stays valid while
    /// other entries are popped.
    front: u64,
    /// Key to the position of its newest queued entry.
    by_key: HashMap<String, u64>,
    /// Length from which messages with a queued key replace it.
    threshold: usize,
    /// Messages queued beyond `threshold` at most (the topic's number of keys).
    max_keys: usize,
    /// Messages replaced since this queue was made.
    skipped_total: u64,
}

impl<M> ConflateQueue<M> {
    /// A queue that conflates from `threshold` queued messages and holds at most
    /// `threshold + max_keys`.
    pub fn new(threshold: usize, max_keys: usize) -> ConflateQueue<M> {
        ConflateQueue {
            entries: VecDeque::new(),
            front: 0,
            by_key: HashMap::new(),
            threshold,
            max_keys,
            skipped_total: 0,
        }
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Messages replaced (skipped) since this queue was made: for a counter.
    pub fn skipped_total(&self) -> u64 {
        self.skipped_total
    }

    /// The most messages this queue holds.
    pub fn capacity(&self) -> usize {
        self.threshold.saturating_add(self.max_keys)
    }

    /// Adds a publication with its key (from [`KeySource::key_of`]).
    pub fn push(&mut self, key: Option<String>, message: M) -> Push<M> {
        self.push_after(key, message, 0)
    }

    /// [`ConflateQueue::push`] of a message that already replaced `earlier` others before it
    /// reached this queue (publish debouncing): its notice counts them too. They are not in
    /// [`ConflateQueue::skipped_total`], which counts this queue's own replacements.
    pub fn push_after(&mut self, key: Option<String>, message: M, earlier: u64) -> Push<M> {
        if self.entries.len() >= self.threshold {
            if let Some(k) = &key {
                if let Some(&pos) = self.by_key.get(k) {
                    let slot = usize::try_from(pos - self.front)
                        .ok()
                        .and_then(|i| self.entries.get_mut(i));
                    if let Some(e) = slot {
                        e.message = message;
                        e.skipped += 1 + earlier;
                        self.skipped_total += 1;
                        return Push::Replaced;
                    }
                }
            }
        }
        if self.entries.len() >= self.capacity() {
            return Push::Full(message);
        }
        let pos = self.front + self.entries.len() as u64;
        if let Some(k) = &key {
            self.by_key.insert(k.clone(), pos);
        }
        self.entries.push_back(Entry {
            key,
            message,
            skipped: earlier,
        });
        Push::Queued
    }

    /// The next thing to send: a [`Notice`] before a message that replaced others, then the
    /// message.
    pub fn poll(&mut self) -> Option<Item<M>> {
        let front = self.entries.front_mut()?;
        if front.skipped > 0 {
            // The count moves into the notice: should the message be replaced again before it
            // is polled, another notice with the new count comes first.
            let skipped = std::mem::take(&mut front.skipped);
            return Some(Item::Conflated(Notice { skipped }));
        }
        let Entry {
            key,
            message,
            skipped: _,
        } = self.entries.pop_front()?;
        if let Some(k) = key {
            if self.by_key.get(&k) == Some(&self.front) {
                self.by_key.remove(&k);
            }
        }
        self.front += 1;
        Some(Item::Message(message))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    fn drain(q: &mut ConflateQueue<(u32, u32)>) -> Vec<Item<(u32, u32)>> {
        std::iter::from_fn(|| q.poll()).collect()
    }

    #[test]
    fn below_the_threshold_every_message_is_delivered_in_order() {
        let mut q = ConflateQueue::new(4, 10);
        for i in 0..4 {
            assert_eq!(q.push(Some("k".into()), (0, i)), Push::Queued);
        }
        let out = drain(&mut q);
        assert_eq!(
            out,
            (0..4).map(|i| Item::Message((0, i))).collect::<Vec<_>>()
        );
    }

    #[test]
    fn past_the_threshold_a_newer_message_takes_the_older_ones_place_with_a_notice() {
        let mut q = ConflateQueue::new(2, 10);
        assert_eq!(q.push(Some("a".into()), (0, 1)), Push::Queued);
        assert_eq!(q.push(Some("b".into()), (1, 1)), Push::Queued);
        assert_eq!(q.push(Some("a".into()), (0, 2)), Push::Replaced);
        assert_eq!(q.push(Some("a".into()), (0, 3)), Push::Replaced);
        assert_eq!(q.push(None, (9, 9)), Push::Queued);
        assert_eq!(q.push(Some("c".into()), (2, 1)), Push::Queued);
        assert_eq!(q.skipped_total(), 2);
        assert_eq!(
            drain(&mut q),
            vec![
                Item::Conflated(Notice { skipped: 2 }),
                Item::Message((0, 3)),
                Item::Message((1, 1)),
                Item::Message((9, 9)),
                Item::Message((2, 1)),
            ]
        );
    }

    #[test]
    fn the_backlog_is_bounded_by_threshold_plus_keys_and_hands_back_what_it_refuses() {
        let mut q = ConflateQueue::new(2, 3);
        for k in 0..5u32 {
            assert_eq!(q.push(Some(k.to_string()), (k, 0)), Push::Queued);
        }
        assert_eq!(q.push(Some("new".into()), (5, 0)), Push::Full((5, 0)));
        assert_eq!(q.push(None, (6, 0)), Push::Full((6, 0)));
        assert_eq!(q.push(Some("3".into()), (3, 1)), Push::Replaced);
        assert_eq!(q.len(), 5);
    }

    #[test]
    fn messages_debounced_before_the_queue_carry_their_count_into_its_notice() {
        let mut q = ConflateQueue::new(1, 10);
        assert_eq!(q.push_after(Some("a".into()), (0, 3), 2), Push::Queued);
        assert_eq!(q.push_after(Some("a".into()), (0, 6), 2), Push::Replaced);
        assert_eq!(q.skipped_total(), 1);
        assert_eq!(
            drain(&mut q),
            vec![
                Item::Conflated(Notice { skipped: 5 }),
                Item::Message((0, 6))
            ]
        );
    }

    #[test]
    fn a_key_popped_and_queued_again_is_replaced_at_its_new_place() {
        let mut q = ConflateQueue::new(1, 10);
        q.push(Some("a".into()), (0, 1));
        assert_eq!(q.poll(), Some(Item::Message((0, 1))));
        assert_eq!(q.push(Some("a".into()), (0, 2)), Push::Queued);
        assert_eq!(q.push(Some("a".into()), (0, 3)), Push::Replaced);
        assert_eq!(
            drain(&mut q),
            vec![
                Item::Conflated(Notice { skipped: 1 }),
                Item::Message((0, 3))
            ]
        );
    }

    #[test]
    fn a_publishers_key_is_bounded_in_bytes_and_free_of_control_characters() {
        assert_eq!(validate_publish_key("EURUSD"), Ok(()));
        assert_eq!(validate_publish_key(&"k".repeat(MAX_KEY)), Ok(()));
        // 86 three-byte characters: 258 bytes, though only 86 characters.
        assert_eq!(
            validate_publish_key(&"€".repeat(86)),
            Err(PublishKeyError::TooLong(258))
        );
        assert_eq!(validate_publish_key(""), Err(PublishKeyError::Empty));
        assert_eq!(validate_publish_key("a\nb"), Err(PublishKeyError::Control));
    }

    #[test]
    fn keys_come_from_a_json_pointer_or_the_publish_field() {
        let p = KeySource::parse("/instrument/id").unwrap();
        assert_eq!(
            p.key_of(br#"{"instrument":{"id":"EURUSD"},"bid":1}"#, None),
            Some("EURUSD".into())
        );
        assert_eq!(
            p.key_of(br#"{"instrument":{"id":42}}"#, None),
            Some("42".into())
        );
        assert_eq!(p.key_of(br#"{"instrument":{}}"#, None), None);
        assert_eq!(p.key_of(br#"{"instrument":{"id":[1]}}"#, None), None);
        assert_eq!(p.key_of(b"not json", Some("x")), None);
        let long = format!(r#"{{"instrument":{{"id":"{}"}}}}"#, "x".repeat(300));
        assert_eq!(p.key_of(long.as_bytes(), None), None);
        assert_eq!(
            KeySource::parse("field").unwrap().key_of(b"", Some("k1")),
            Some("k1".into())
        );
        assert_eq!(KeySource::parse("field").unwrap().key_of(b"", None), None);
        assert_eq!(
            KeySource::parse("id"),
            Err(KeySourceError::NotAPointer("id".into()))
        );
    }

    /// splitmix64, so a failure repeats with its seed.
    #[test]
    fn latest_value_of_every_key_is_delivered_exactly_once_and_skips_add_up() {
        let mut rng = Rng(51);
        for case in 0..300 {
            let keys = 1 + rng.below(12) as u32;
            let threshold = rng.below(6);
            // Every other case: all messages keyed and room for every key, so the bound must
            // never be reached (conflation, not refusal, keeps the backlog short).
            let roomy = case % 2 == 0;
            let max_keys = if roomy {
                keys as usize + rng.below(4)
            } else {
                1 + rng.below(16)
            };
            let mut q: ConflateQueue<(u32, u32)> = ConflateQueue::new(threshold, max_keys);
            // Message (key, n): the n-th publication of `key`; key `keys` stands for unkeyed.
            let mut published = vec![0u32; keys as usize + 1];
            let mut delivered: Vec<(u32, u32)> = Vec::new();
            let (mut refused, mut noticed, mut pending_notice) = (0u64, 0u64, None);
            let mut take = |item: Item<(u32, u32)>, delivered: &mut Vec<(u32, u32)>| match item {
                Item::Conflated(n) => {
                    assert!(n.skipped > 0);
                    pending_notice = Some(pending_notice.unwrap_or(0) + n.skipped);
                }
                Item::Message(m) => {
                    if let Some(s) = pending_notice.take() {
                        noticed += s;
                    }
                    delivered.push(m);
                }
            };
            for _ in 0..rng.below(400) {
                if rng.below(3) == 0 {
                    if let Some(item) = q.poll() {
                        take(item, &mut delivered);
                    }
                } else {
                    let k = rng.below(keys as usize + usize::from(!roomy)) as u32;
                    published[k as usize] += 1;
                    let key = (k < keys).then(|| k.to_string());
                    if let Push::Full(_) = q.push(key, (k, published[k as usize])) {
                        refused += 1;
                    }
                }
                assert!(q.len() <= threshold + max_keys, "case {case}: bounded");
            }
            while let Some(item) = q.poll() {
                take(item, &mut delivered);
            }
            let total: u64 = published.iter().map(|&n| u64::from(n)).sum();
            assert_eq!(
                delivered.len() as u64 + q.skipped_total() + refused,
                total,
                "case {case}: every publication delivered, skipped or refused"
            );
            assert_eq!(noticed, q.skipped_total(), "case {case}: notices add up");
            if roomy {
                assert_eq!(refused, 0, "case {case}: keys fit, nothing refused");
            }
            for k in 0..=keys {
                let mine: Vec<u32> = delivered.iter().filter(|m| m.0 == k).map(|m| m.1).collect();
                assert!(
                    mine.windows(2).all(|w| w[0] < w[1]),
                    "case {case}: key {k} in order, once each"
                );
                if refused == 0 && published[k as usize] > 0 {
                    assert_eq!(
                        mine.last(),
                        Some(&published[k as usize]),
                        "case {case}: key {k}'s latest value delivered"
                    );
                }
            }
        }
    }
}
