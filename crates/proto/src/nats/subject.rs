//! NATS subjects: which names are valid, and a reversible mapping from Clarion topics.
//!
//! A subject is one or more non-empty tokens separated by `.`, with no whitespace or control
//! bytes; in a subscription a token may be the wildcard `*`, and the last one `>`. A Clarion
//! topic (1 to [`MAX_TOPIC_LEN`] bytes of `[A-Za-z0-9_.:@/-]`) may contain `.`, even at its
//! ends or twice in a row, so it cannot be used as a subject as it is. [`SubjectMap`] turns a
//! topic into a single token of `[A-Za-z0-9_-]` under a prefix, escaping with `_`:
//!
//! | topic byte | token |
//! |---|---|
//! | `_` | `__` |
//! | `.` | `_d` |
//! | `:` | `_c` |
//! | `@` | `_a` |
//! | `/` | `_s` |
//! | others | themselves |
//!
//! so `prices.eu:BTC` under `clarion.t` is `clarion.t.prices_deu_cBTC`. Each escape is two
//! bytes, so a subject is at most `prefix + 1 + 2 × 128` bytes. The mapping is injective and
//! [`SubjectMap::topic`] inverts it, refusing anything it could not have produced.

use crate::pubsub::topic::{validate_topic, TopicError, MAX_TOPIC_LEN};

/// The prefix Clarion's topics live under unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "clarion.t";

/// Why a subject was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    /// The subject is empty.
    #[error("subject is empty")]
    Empty,
    /// A token is empty: the subject starts or ends with `.`, or has `..`.
    #[error("subject has an empty token")]
    EmptyToken,
    /// A byte is whitespace, a control byte or not ASCII: it would split or break the
    /// protocol line.
    #[error("subject may not contain whitespace, control or non-ASCII bytes")]
    BadByte,
    /// A wildcard (`*`, `>`) where none is allowed: in a publish subject, inside a token, or
    /// `>` before the last token.
    #[error("misplaced wildcard in subject")]
    Wildcard,
    /// The topic given to [`SubjectMap::subject`] is not a valid Clarion topic.
    #[error("not a Clarion topic: {0}")]
    Topic(#[from] TopicError),
}

/// Checks a subject; `wildcards` allows `*` tokens and a final `>` token (subscriptions).
pub fn validate_subject(subject: &str, wildcards: bool) -> Result<(), SubjectError> {
    if subject.is_empty() {
        return Err(SubjectError::Empty);
    }
    let mut tokens = subject.split('.').peekable();
    while let Some(token) = tokens.next() {
        if token.is_empty() {
            return Err(SubjectError::EmptyToken);
        }
        if token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            return Err(SubjectError::BadByte);
        }
        let whole_wildcard = token == "*" || (token == ">" && tokens.peek().is_none());
        if token.bytes().any(|b| b == b'*' || b == b'>') && !(wildcards && whole_wildcard) {
            return Err(SubjectError::Wildcard);
        }
    }
    Ok(())
}

/// Maps Clarion topics to subjects under a prefix and back (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectMap {
    /// The prefix with its trailing `.`, so a subject is `prefix` + token.
    prefix: String,
}

impl Default for SubjectMap {
    fn default() -> Self {
        SubjectMap {
            prefix: format!("{DEFAULT_PREFIX}."),
        }
    }
}

impl SubjectMap {
    /// A map under `prefix`: one or more tokens without wildcards (`clarion.t`, `prod.push`).
    pub fn new(prefix: &str) -> Result<SubjectMap, SubjectError> {
        validate_subject(prefix, false)?;
        Ok(SubjectMap {
            prefix: format!("{prefix}."),
        })
    }

    /// The prefix, without its trailing `.`.
    pub fn prefix(&self) -> &str {
        self.prefix.strip_suffix('.').unwrap_or(&self.prefix)
    }

    /// A subscription subject that matches every topic under this prefix (`prefix.*`).
    pub fn wildcard(&self) -> String {
        format!("{}*", self.prefix)
    }

    /// The subject for `topic`; refuses anything that is not a valid Clarion topic.
    pub fn subject(&self, topic: &str) -> Result<String, SubjectError> {
        validate_topic(topic)?;
        let mut out = String::with_capacity(self.prefix.len() + 2 * topic.len());
        out.push_str(&self.prefix);
        for c in topic.chars() {
            match c {
                '_' => out.push_str("__"),
                '.' => out.push_str("_d"),
                ':' => out.push_str("_c"),
                '@' => out.push_str("_a"),
                '/' => out.push_str("_s"),
                c => out.push(c),
            }
        }
        Ok(out)
    }

    /// The topic a subject stands for, or `None` when the subject is not under this prefix or
    /// is not something [`SubjectMap::subject`] produces (a stray escape, a byte outside
    /// `[A-Za-z0-9_-]`, a topic that would be too long).
    pub fn topic(&self, subject: &str) -> Option<String> {
        let token = subject.strip_prefix(&self.prefix)?;
        if token.is_empty() || token.len() > 2 * MAX_TOPIC_LEN {
            return None;
        }
        let mut out = String::with_capacity(token.len());
        let mut bytes = token.bytes();
        while let Some(b) = bytes.next() {
            let c = match b {
                b'_' => match bytes.next()? {
                    b'_' => '_',
                    b'd' => '.',
                    b'c' => ':',
                    b'a' => '@',
                    b's' => '/',
                    _ => return None,
                },
                b'-' => '-',
                b if b.is_ascii_alphanumeric() => char::from(b),
                _ => return None,
            };
            out.push(c);
        }
        validate_topic(&out).ok()?;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte a topic may contain.
    fn topic_bytes() -> Vec<u8> {
        (0u8..=255)
            .filter(|b| validate_topic(&char::from(*b).to_string()).is_ok())
            .collect()
    }

    #[test]
    fn subjects() {
        assert_eq!(validate_subject("a.b.c", false), Ok(()));
        assert_eq!(validate_subject("", false), Err(SubjectError::Empty));
        for bad in [".a", "a.", "a..b"] {
            assert_eq!(validate_subject(bad, true), Err(SubjectError::EmptyToken));
        }
        for bad in ["a b", "a\tb", "a\r\n", "é", "a\0"] {
            assert_eq!(
                validate_subject(bad, true),
                Err(SubjectError::BadByte),
                "{bad:?}"
            );
        }
        assert_eq!(validate_subject("a.*.>", true), Ok(()));
        assert_eq!(validate_subject("a.*", false), Err(SubjectError::Wildcard));
        assert_eq!(validate_subject("a.>.b", true), Err(SubjectError::Wildcard));
        assert_eq!(validate_subject("a.b*", true), Err(SubjectError::Wildcard));
    }

    #[test]
    fn the_charset_is_what_the_escaping_covers() {
        let bytes = topic_bytes();
        assert_eq!(bytes.len(), 26 + 26 + 10 + 6);
    }

    #[test]
    fn every_single_byte_and_every_pair_round_trips() {
        let map = SubjectMap::default();
        let bytes = topic_bytes();
        for &a in &bytes {
            for &b in bytes.iter().chain(std::iter::once(&b'x')) {
                for topic in [
                    String::from(char::from(a)),
                    format!("{}{}", char::from(a), char::from(b)),
                ] {
                    let subject = map.subject(&topic).expect("valid topic");
                    assert_eq!(validate_subject(&subject, false), Ok(()), "{subject}");
                    let token = subject.strip_prefix("clarion.t.").expect("prefix");
                    assert!(
                        token
                            .bytes()
                            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-'),
                        "{token}"
                    );
                    assert_eq!(map.topic(&subject).as_deref(), Some(topic.as_str()));
                }
            }
        }
    }

    #[test]
    fn longest_topics_round_trip() {
        let map = SubjectMap::new("prod.push").expect("prefix");
        for b in topic_bytes() {
            let topic = String::from(char::from(b)).repeat(MAX_TOPIC_LEN);
            let subject = map.subject(&topic).expect("valid");
            assert!(subject.len() <= "prod.push.".len() + 2 * MAX_TOPIC_LEN);
            assert_eq!(map.topic(&subject), Some(topic));
        }
        assert_eq!(
            map.subject(&"a".repeat(MAX_TOPIC_LEN + 1)),
            Err(SubjectError::Topic(TopicError::TooLong))
        );
        assert_eq!(map.prefix(), "prod.push");
        assert_eq!(map.wildcard(), "prod.push.*");
    }

    #[test]
    fn examples() {
        let map = SubjectMap::default();
        assert_eq!(
            map.subject("prices.eu:BTC/EUR@x-1_y").as_deref(),
            Ok("clarion.t.prices_deu_cBTC_sEUR_ax-1__y")
        );
        assert_eq!(map.subject(".."), Ok("clarion.t._d_d".to_owned()));
        assert_eq!(map.subject(""), Err(SubjectError::Topic(TopicError::Empty)));
        assert_eq!(
            map.subject("a b"),
            Err(SubjectError::Topic(TopicError::BadChar))
        );
    }

    #[test]
    fn foreign_subjects_are_not_topics() {
        let map = SubjectMap::default();
        for subject in [
            "other.x",
            "clarion.t.",
            "clarion.t",
            "clarion.t.a.b",
            "clarion.t._",
            "clarion.t._x",
            "clarion.t.a*",
            "clarion.tx.a",
        ] {
            assert_eq!(map.topic(subject), None, "{subject}");
        }
        let long = format!("clarion.t.{}", "a".repeat(MAX_TOPIC_LEN + 1));
        assert_eq!(map.topic(&long), None);
        assert_eq!(SubjectMap::new("a..b"), Err(SubjectError::EmptyToken));
        assert_eq!(SubjectMap::new("a.*"), Err(SubjectError::Wildcard));
    }
}
