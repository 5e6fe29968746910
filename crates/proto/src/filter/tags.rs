//! The bounds of a publication's tags (what filters read): string keys and values, few and
//! short, so that evaluating a filter costs a few comparisons and a tag map fits in a message's
//! envelope.

/// Longest tag key, in bytes.
pub const MAX_KEY: usize = 64;
/// Longest tag value, in bytes: an instrument, a league, a price as text.
pub const MAX_VALUE: usize = 256;
/// Most tags on one publication: filters name a handful, and each tag is carried by every
/// delivery of the publication's envelope.
pub const MAX_TAGS: usize = 32;

/// Why a publication's tags were refused (a `400` to the publisher).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// More tags than [`MAX_TAGS`].
    #[error("more than {MAX_TAGS} tags")]
    TooMany,
    /// A key outside [`valid_key`]'s rules.
    #[error("tag key {0:?} is not 1-64 of A-Z a-z 0-9 _ . : - / (and not and/or/not/in)")]
    BadKey(String),
    /// A value longer than [`MAX_VALUE`].
    #[error("tag {0:?} has a value longer than {MAX_VALUE} bytes")]
    ValueTooLong(String),
    /// The same key twice.
    #[error("tag {0:?} appears twice")]
    Duplicate(String),
}

/// Words of the filter language, which therefore cannot be keys.
pub const KEYWORDS: [&str; 4] = ["and", "or", "not", "in"];

/// Whether `c` may appear in a tag key.
pub fn key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-' | b'/')
}

/// A tag key: 1 to [`MAX_KEY`] bytes of `A-Z a-z 0-9 _ . : - /`, not a keyword of the filter
/// language, and not starting like a number (so `-1` is never read as a key).
pub fn valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_KEY
        && b.iter().all(|&c| key_char(c))
        && !b
            .first()
            .is_some_and(|c| c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && !KEYWORDS.contains(&key)
}

/// Checks a publication's tags against the bounds above.
pub fn validate_tags<'a>(
    tags: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), TagError> {
    let mut seen: Vec<&str> = Vec::new();
    for (k, v) in tags {
        if seen.len() == MAX_TAGS {
            return Err(TagError::TooMany);
        }
        if !valid_key(k) {
            return Err(TagError::BadKey(k.chars().take(MAX_KEY).collect()));
        }
        if v.len() > MAX_VALUE {
            return Err(TagError::ValueTooLong(k.to_owned()));
        }
        if seen.contains(&k) {
            return Err(TagError::Duplicate(k.to_owned()));
        }
        seen.push(k);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_rules() {
        for ok in ["sport", "a", "x.y", "ns:k", "a-b/c", "_x", "And"] {
            assert!(valid_key(ok), "{ok}");
        }
        for bad in [
            "",
            "in",
            "and",
            "not",
            "or",
            "1abc",
            "-x",
            ".x",
            "a b",
            "é",
            &"k".repeat(65),
        ] {
            assert!(!valid_key(bad), "{bad}");
        }
    }

    #[test]
    fn tags_are_bounded_in_count_key_value_and_uniqueness() {
        assert_eq!(validate_tags([("a", "1"), ("b", "2")]), Ok(()));
        let many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        let refs = many.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        assert_eq!(validate_tags(refs), Err(TagError::TooMany));
        assert_eq!(
            validate_tags([("in", "1")]),
            Err(TagError::BadKey("in".into()))
        );
        let long = "v".repeat(257);
        assert_eq!(
            validate_tags([("a", long.as_str())]),
            Err(TagError::ValueTooLong("a".into()))
        );
        assert_eq!(
            validate_tags([("a", "1"), ("a", "2")]),
            Err(TagError::Duplicate("a".into()))
        );
    }
}
