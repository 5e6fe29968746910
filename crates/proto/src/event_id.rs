//! Message ids: `EPOCH-SEQ`, for example `k3x9q2mf-1042`.
//!
//! `SEQ` is a decimal sequence number that grows with publish order (across all topics of a
//! server, so it is also monotonic within each topic). `EPOCH` names the server run that issued
//! it: 1 to 16 characters of `[0-9a-z]`, different after every restart. A client resuming from an
//! id of another epoch cannot be served gap-free, and is told so.

use std::fmt;

/// Longest epoch, in characters.
pub const MAX_EPOCH_LEN: usize = 16;

/// A parsed message id, borrowing its epoch from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventId<'a> {
    /// The server run that issued the id.
    pub epoch: &'a str,
    /// The position in that run's publish order.
    pub seq: u64,
}

/// Why a string is not a message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidId;

impl fmt::Display for InvalidId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a message id (expected EPOCH-SEQ, e.g. k3x9q2mf-1042)")
    }
}

impl std::error::Error for InvalidId {}

/// Whether `epoch` is a well-formed epoch.
pub fn is_epoch(epoch: &str) -> bool {
    (1..=MAX_EPOCH_LEN).contains(&epoch.len())
        && epoch
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// Parses `EPOCH-SEQ`. `SEQ` is 1 to 20 decimal digits that fit in a `u64`, without leading
/// zeros, so every id has exactly one spelling.
pub fn parse(s: &str) -> Result<EventId<'_>, InvalidId> {
    let (epoch, seq) = s.split_once('-').ok_or(InvalidId)?;
    if !is_epoch(epoch)
        || seq.is_empty()
        || seq.len() > 20
        || !seq.bytes().all(|b| b.is_ascii_digit())
        || (seq.len() > 1 && seq.starts_with('0'))
    {
        return Err(InvalidId);
    }
    let seq = seq.parse().map_err(|_| InvalidId)?;
    Ok(EventId { epoch, seq })
}

impl fmt::Display for EventId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.epoch, self.seq)
    }
}

/// The start position that asks for a topic's last message, then everything after it
/// (`since=latest`). No id is spelled so: an id has a `-`.
pub const LATEST: &str = "latest";

/// Checks a resume position: one id, or (as a clustered server gives a subscription to several
/// topics, whose ids are per topic) a comma-separated list of `topic:EPOCH-SEQ` or `EPOCH-SEQ`
/// entries. Topic names hold no commas and ids no colons, so the list splits unambiguously.
pub fn validate_cursor(s: &str) -> Result<(), InvalidId> {
    if !s.contains(',') && !s.contains(':') {
        return parse(s).map(|_| ());
    }
    for entry in s.split(',') {
        let id = match entry.rsplit_once(':') {
            Some((topic, id)) => {
                crate::pubsub::validate_topic(topic).map_err(|_| InvalidId)?;
                id
            }
            None => entry,
        };
        parse(id)?;
    }
    Ok(())
}

/// Spells a number in base 36 with lowercase letters (how epochs are made from entropy).
pub fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::with_capacity(13);
    loop {
        out.extend(DIGITS.get((n % 36) as usize));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The id a resume string `given` (ids separated by commas, as a client resuming `topics` topics
/// sends them) holds for `topic`, as epoch and offset: the one named for it (`topic:EPOCH-SEQ`),
/// or the only id given when the subscriber follows one topic.
pub fn resume_id<'a>(given: &'a str, topic: &str, topics: usize) -> Option<(&'a str, u64)> {
    let mut unnamed = None;
    for s in given.split(',').map(str::trim) {
        match s.rsplit_once(':') {
            Some((t, id)) if t == topic => {
                let id = parse(id).ok()?;
                return Some((id.epoch, id.seq));
            }
            Some(_) => {}
            None if topics == 1 && !given.contains(',') => {
                unnamed = parse(s).ok().map(|id| (id.epoch, id.seq));
            }
            None => {}
        }
    }
    unnamed
}

#[cfg(test)]
mod cursor_tests {
    use super::validate_cursor;

    #[test]
    fn cursors_are_ids_or_per_topic_lists() {
        assert!(validate_cursor("k3-1").is_ok());
        assert!(validate_cursor("a:k3-1,b.c:x-0").is_ok());
        assert!(validate_cursor("k3-1,x-2").is_ok());
        assert!(validate_cursor("a:k3-1,").is_err());
        assert!(validate_cursor("bad topic:k3-1").is_err());
        assert!(validate_cursor("a:k3").is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let id = parse("k3x9q2mf-1042").expect("valid");
        assert_eq!(
            id,
            EventId {
                epoch: "k3x9q2mf",
                seq: 1042
            }
        );
        assert_eq!(id.to_string(), "k3x9q2mf-1042");
        assert_eq!(parse("a-0").map(|i| i.seq), Ok(0));
        assert_eq!(parse("a-18446744073709551615").map(|i| i.seq), Ok(u64::MAX));
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in [
            "",
            "-",
            "1042",
            "a-",
            "-5",
            "A-5",
            "a_b-5",
            "a-5x",
            "a-+5",
            "a- 5",
            "a-5-6",
            "a-18446744073709551616",
            "abcdefghijklmnopq-1",
            "é-1",
            // Found by fuzzing: a leading zero would give one id two spellings.
            "8-09",
            "a-00",
        ] {
            assert_eq!(parse(bad), Err(InvalidId), "{bad:?}");
        }
    }

    #[test]
    fn base36_spells_numbers() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert!(is_epoch(&base36(u64::MAX)));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod resume_id_tests {
    use super::resume_id;

    #[test]
    fn the_id_of_a_topic_is_named_or_the_only_one() {
        assert_eq!(resume_id("ab-12", "t", 1), Some(("ab", 12)));
        assert_eq!(resume_id("u:ab-1, t:cd-7", "t", 2), Some(("cd", 7)));
        // Unnamed ids of several topics apply by epoch, which this node may not know yet.
        assert_eq!(resume_id("ab-1,cd-7", "t", 2), None);
        assert_eq!(resume_id("ab-1", "t", 2), None);
        assert_eq!(resume_id("not an id", "t", 1), None);
        assert_eq!(resume_id("u:ab-1", "t", 2), None);
    }

    /// A hand-over's positions (`topic:EPOCH-SEQ`, topics that may hold `:`).
    #[test]
    fn a_gap_is_positioned_where_its_topic_stands() {
        assert_eq!(resume_id("k3-7", "a", 1), Some(("k3", 7)));
        assert_eq!(resume_id("a:k3-7,b:c:q9-0", "b:c", 2), Some(("q9", 0)));
        assert_eq!(resume_id("a:k3-7", "b", 2), None);
        assert_eq!(resume_id("garbage", "a", 1), None);
    }
}
