//! Topic and SSE event names: which names a publisher or subscriber may use.
//!
//! Both share one charset, `[A-Za-z0-9_.:@/-]`, which is URL- and JSON-safe: a valid name never
//! needs escaping in a query string, a path, an SSE field or an envelope.

/// Longest topic name, in bytes. Long enough for `tenant:room/sub-room@region` shapes, short
/// enough that a subscriber index entry stays small.
pub const MAX_TOPIC_LEN: usize = 128;

/// Longest SSE event name, in bytes: event names label a kind of message, not data.
pub const MAX_EVENT_NAME_LEN: usize = 64;

/// Why a topic name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The name is empty.
    #[error("topic name is empty")]
    Empty,
    /// The name is longer than [`MAX_TOPIC_LEN`] bytes.
    #[error("topic name longer than 128 bytes")]
    TooLong,
    /// The name has a byte outside `[A-Za-z0-9_.:@/-]`.
    #[error("topic name may only contain A-Z a-z 0-9 _ . : @ / -")]
    BadChar,
}

/// Why an SSE event name was refused. Every variant reads the same to the publisher (one rule
/// states all three limits); the variants tell tests and callers which limit was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventNameError {
    /// The name is empty.
    #[error("event names are 1 to 64 characters of A-Z a-z 0-9 _ . : @ / -")]
    Empty,
    /// The name is longer than [`MAX_EVENT_NAME_LEN`] bytes.
    #[error("event names are 1 to 64 characters of A-Z a-z 0-9 _ . : @ / -")]
    TooLong,
    /// The name has a byte outside `[A-Za-z0-9_.:@/-]` (a newline would end the SSE field).
    #[error("event names are 1 to 64 characters of A-Z a-z 0-9 _ . : @ / -")]
    BadChar,
}

/// Whether `b` may appear in a topic or event name.
fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'@' | b'/' | b'-')
}

/// Checks a topic name: 1 to [`MAX_TOPIC_LEN`] bytes of `[A-Za-z0-9_.:@/-]`.
pub fn validate_topic(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(TopicError::TooLong);
    }
    if name.bytes().all(name_byte) {
        Ok(())
    } else {
        Err(TopicError::BadChar)
    }
}

/// Checks an SSE event name given by a publisher: 1 to [`MAX_EVENT_NAME_LEN`] bytes of
/// `[A-Za-z0-9_.:@/-]`.
pub fn validate_event_name(name: &str) -> Result<(), EventNameError> {
    if name.is_empty() {
        return Err(EventNameError::Empty);
    }
    if name.len() > MAX_EVENT_NAME_LEN {
        return Err(EventNameError::TooLong);
    }
    if name.bytes().all(name_byte) {
        Ok(())
    } else {
        Err(EventNameError::BadChar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert_eq!(validate_topic("prices.eu:BTC/EUR@x-1_y"), Ok(()));
        assert_eq!(validate_topic(""), Err(TopicError::Empty));
        assert_eq!(validate_topic(&"a".repeat(128)), Ok(()));
        assert_eq!(validate_topic(&"a".repeat(129)), Err(TopicError::TooLong));
        for bad in ["a b", "a\"", "é", "a?b", "a#", "a%20"] {
            assert_eq!(validate_topic(bad), Err(TopicError::BadChar), "{bad}");
        }
    }

    #[test]
    fn event_names() {
        assert!(validate_event_name("price-update").is_ok());
        assert_eq!(validate_event_name(""), Err(EventNameError::Empty));
        assert_eq!(validate_event_name("a\nb"), Err(EventNameError::BadChar));
        assert_eq!(validate_event_name(&"e".repeat(64)), Ok(()));
        assert_eq!(
            validate_event_name(&"e".repeat(65)),
            Err(EventNameError::TooLong)
        );
        // The text publishers see is the same whichever limit was hit.
        assert_eq!(
            EventNameError::TooLong.to_string(),
            "event names are 1 to 64 characters of A-Z a-z 0-9 _ . : @ / -"
        );
    }
}
