//! Percent-decoding, the one decoder for every listener: query strings (`key=value` pairs
//! separated by `&`, with `+` a space, as HTML forms and most client libraries encode it) and
//! request paths (where `+` is itself). A topic arrives in either (`?topic=` on the client
//! listener, `/publish/{topic}` on the API) and is decoded here before it is checked or quoted.

use std::borrow::Cow;

/// Why one query pair could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A `%` not followed by two hex digits.
    #[error("invalid percent escape in query string")]
    BadEscape,
    /// The decoded bytes are not UTF-8.
    #[error("query string is not UTF-8 once decoded")]
    NotUtf8,
}

/// Iterates the pairs of `query`. A pair without `=` has an empty value; empty pieces
/// (`a=1&&b=2`) are skipped. A pair that fails to decode is yielded as an error so the caller
/// can answer 400 instead of silently dropping it.
pub fn query_pairs(
    query: &str,
) -> impl Iterator<Item = Result<(Cow<'_, str>, Cow<'_, str>), QueryError>> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        Ok((decode(k)?, decode(v)?))
    })
}

/// Why a request path could not be percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A `%` not followed by two hex digits.
    #[error("invalid percent escape in the path")]
    BadEscape,
    /// The decoded bytes are not UTF-8.
    #[error("the path is not UTF-8 once percent-decoded")]
    NotUtf8,
}

/// `path` percent-decoded (`%20` is a space; `+` stays `+`).
pub fn decode_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    decode_with(path, false).map_err(|e| match e {
        QueryError::BadEscape => PathError::BadEscape,
        QueryError::NotUtf8 => PathError::NotUtf8,
    })
}

fn decode(s: &str) -> Result<Cow<'_, str>, QueryError> {
    decode_with(s, true)
}

/// Percent-decodes `s`; `plus_is_space` for query strings.
fn decode_with(s: &str, plus_is_space: bool) -> Result<Cow<'_, str>, QueryError> {
    if !s.bytes().any(|b| b == b'%' || (plus_is_space && b == b'+')) {
        return Ok(Cow::Borrowed(s));
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|&c| hex(c));
                let lo = bytes.get(i + 2).and_then(|&c| hex(c));
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(QueryError::BadEscape);
                };
                out.push(hi << 4 | lo);
                i += 2;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| QueryError::NotUtf8)
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<Result<(String, String), QueryError>> {
        query_pairs(q)
            .map(|r| r.map(|(k, v)| (k.into_owned(), v.into_owned())))
            .collect()
    }

    fn ok(k: &str, v: &str) -> Result<(String, String), QueryError> {
        Ok((k.to_owned(), v.to_owned()))
    }

    #[test]
    fn paths_decode_escapes_but_not_plus() {
        assert_eq!(decode_path("/publish/a+b").unwrap(), "/publish/a+b");
        assert_eq!(
            decode_path("/publish/bad%20topic").unwrap(),
            "/publish/bad topic"
        );
        assert_eq!(decode_path("/publish/a%2Fb%3a").unwrap(), "/publish/a/b:");
        assert_eq!(decode_path("/p/%4"), Err(PathError::BadEscape));
        assert_eq!(decode_path("/p/%ff"), Err(PathError::NotUtf8));
    }

    #[test]
    fn plain_pairs_borrow() {
        let all: Vec<_> = query_pairs("topic=a&topic=b").collect();
        assert!(matches!(
            all[0],
            Ok((Cow::Borrowed("topic"), Cow::Borrowed("a")))
        ));
        assert_eq!(
            pairs("topic=a&topic=b"),
            vec![ok("topic", "a"), ok("topic", "b")]
        );
    }

    #[test]
    fn decoding() {
        assert_eq!(pairs("t=a%2Fb+c"), vec![ok("t", "a/b c")]);
        assert_eq!(pairs("t=%C3%A9"), vec![ok("t", "é")]);
        assert_eq!(pairs("flag&&x="), vec![ok("flag", ""), ok("x", "")]);
        assert_eq!(pairs(""), vec![]);
        assert_eq!(pairs("a=b=c"), vec![ok("a", "b=c")]);
    }

    #[test]
    fn errors() {
        assert_eq!(pairs("t=%"), vec![Err(QueryError::BadEscape)]);
        assert_eq!(pairs("t=%4"), vec![Err(QueryError::BadEscape)]);
        assert_eq!(
            pairs("t=%zz&u=1"),
            vec![Err(QueryError::BadEscape), ok("u", "1")]
        );
        assert_eq!(pairs("t=%ff"), vec![Err(QueryError::NotUtf8)]);
        assert_eq!(pairs("%ff=1"), vec![Err(QueryError::NotUtf8)]);
    }
}
