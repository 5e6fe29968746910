//! Topic patterns, as a token's `clarion` claim lists them, and the grants they make up.
//!
//! A pattern is either a topic name (matched exactly) or a prefix followed by one trailing `*`,
//! which matches every topic that starts with the prefix and has at least one more character:
//! `chat.*` matches `chat.lobby` and `chat.a.b`, but not `chat.`, `chat` or
//! `chatroom`. A lone `*` matches every topic. A `*` anywhere else is refused, so a typo in a
//! backend's grant list fails loudly when the token is checked instead of granting too much.

use crate::pubsub::{validate_topic, MAX_TOPIC_LEN};

/// One topic pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Exactly this topic.
    Exact(String),
    /// Any topic that starts with this prefix and is longer than it (`*` alone: any topic).
    Prefix(String),
}

/// Why a pattern was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Empty, too long, or a byte outside the topic charset.
    #[error("pattern is not a topic name, a prefix followed by *, or *")]
    Invalid,
    /// A `*` that is not the last character.
    #[error("* may only end a pattern")]
    InnerWildcard,
}

impl Pattern {
    /// Parses one pattern.
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        if let Some(prefix) = text.strip_suffix('*') {
            if prefix.contains('*') {
                return Err(PatternError::InnerWildcard);
            }
            // The prefix's bytes must be topic bytes; it may be empty (`*`).
            if prefix.len() >= MAX_TOPIC_LEN
                || (!prefix.is_empty() && validate_topic(prefix).is_err())
            {
                return Err(PatternError::Invalid);
            }
            return Ok(Pattern::Prefix(prefix.to_owned()));
        }
        if text.contains('*') {
            return Err(PatternError::InnerWildcard);
        }
        validate_topic(text).map_err(|_| PatternError::Invalid)?;
        Ok(Pattern::Exact(text.to_owned()))
    }

    /// Whether `topic` is covered.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Pattern::Exact(t) => t == topic,
            Pattern::Prefix(p) => topic.len() > p.len() && topic.starts_with(p.as_str()),
        }
    }
}

/// Parses a list of patterns (a configuration setting, or a claim).
pub fn parse_list<'a>(
    items: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Pattern>, PatternError> {
    items.into_iter().map(Pattern::parse).collect()
}

/// Whether any pattern of `list` covers `topic`.
pub fn any_matches(list: &[Pattern], topic: &str) -> bool {
    list.iter().any(|p| p.matches(topic))
}

/// What a token allows: the topics its holder may subscribe to and publish to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Grants {
    /// Topics the holder may subscribe to.
    pub subscribe: Vec<Pattern>,
    /// Topics the holder may publish to.
    pub publish: Vec<Pattern>,
}

impl Grants {
    /// Whether the holder may subscribe to `topic`.
    pub fn may_subscribe(&self, topic: &str) -> bool {
        any_matches(&self.subscribe, topic)
    }

    /// Whether the holder may publish to `topic`.
    pub fn may_publish(&self, topic: &str) -> bool {
        any_matches(&self.publish, topic)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_prefix_patterns() {
        let p = Pattern::parse("chat.*").unwrap();
        assert!(p.matches("chat.lobby"));
        assert!(p.matches("chat.a.b"));
        assert!(!p.matches("chat."));
        assert!(!p.matches("chat"));
        assert!(!p.matches("chatroom"));
        let all = Pattern::parse("*").unwrap();
        assert!(all.matches("a"));
        let e = Pattern::parse("news").unwrap();
        assert!(e.matches("news"));
        assert!(!e.matches("news2"));
        assert!(!e.matches("new"));
        let u = Pattern::parse("user:42/*").unwrap();
        assert!(u.matches("user:42/inbox"));
        assert!(!u.matches("user:421/inbox"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(Pattern::parse(""), Err(PatternError::Invalid));
        assert_eq!(Pattern::parse("a*b"), Err(PatternError::InnerWildcard));
        assert_eq!(Pattern::parse("*.x"), Err(PatternError::InnerWildcard));
        assert_eq!(Pattern::parse("**"), Err(PatternError::InnerWildcard));
        assert_eq!(Pattern::parse("a b"), Err(PatternError::Invalid));
        assert_eq!(
            Pattern::parse(&"a".repeat(MAX_TOPIC_LEN + 1)),
            Err(PatternError::Invalid)
        );
    }
}
