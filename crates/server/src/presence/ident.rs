//! An identity as presence keeps it for each connection: the `sub`, and the `info` JSON when
//! the token has one. Most identities are short and carry no info (a user id, a UUID without
//! dashes, `m` and 16 hex digits): up to [`INLINE`] bytes they live inside the 24-byte value
//! and cost no allocation; longer ones, or ones with info, share one allocation holding both.

use std::sync::Arc;

/// The longest `sub` kept inline (without info).
pub(super) const INLINE: usize = 22;

/// A connection's identity in presence rooms: 24 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Ident(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    /// `bytes[..len]` is the `sub` (no info).
    Inline { len: u8, bytes: [u8; INLINE] },
    /// `text[..sub_len]` is the `sub`, the rest the info (empty: none).
    Shared { sub_len: u32, text: Arc<str> },
}

impl Ident {
    /// The identity `sub` with `info` (a JSON object's text).
    pub fn new(sub: &str, info: Option<&str>) -> Ident {
        let info = info.filter(|i| !i.is_empty());
        match (info, u8::try_from(sub.len())) {
            (None, Ok(len)) if usize::from(len) <= INLINE => {
                let mut bytes = [0; INLINE];
                if let Some(b) = bytes.get_mut(..sub.len()) {
                    b.copy_from_slice(sub.as_bytes());
                }
                Ident(Repr::Inline { len, bytes })
            }
            _ => {
                let mut text = String::with_capacity(sub.len() + info.map_or(0, str::len));
                text.push_str(sub);
                text.push_str(info.unwrap_or_default());
                Ident(Repr::Shared {
                    // A `sub` comes from a token, far below 4 GiB.
                    sub_len: u32::try_from(sub.len()).unwrap_or(u32::MAX),
                    text: text.into(),
                })
            }
        }
    }

    /// The `sub`.
    pub fn sub(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, bytes } => bytes
                .get(..usize::from(*len))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or_default(),
            Repr::Shared { sub_len, text } => text.get(..*sub_len as usize).unwrap_or_default(),
        }
    }

    /// The info, if any.
    pub fn info(&self) -> Option<&str> {
        match &self.0 {
            Repr::Inline { .. } => None,
            Repr::Shared { sub_len, text } => {
                text.get(*sub_len as usize..).filter(|i| !i.is_empty())
            }
        }
    }
}

impl std::fmt::Debug for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ident({:?}, {:?})", self.sub(), self.info())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_identities_are_inline_and_others_shared() {
        assert_eq!(std::mem::size_of::<Ident>(), 24);
        assert_eq!(std::mem::size_of::<Option<Ident>>(), 24);
        let cases = [
            ("", None),
            ("alice", None),
            ("m0123456789abcdef", None),
            ("0123456789012345678901", None),
            ("01234567890123456789012", None),
            ("émile ✓", None),
            ("bob", Some(r#"{"name":"Bob"}"#)),
            ("bob", Some("")),
        ];
        for (sub, info) in cases {
            let id = Ident::new(sub, info);
            assert_eq!(id.sub(), sub);
            assert_eq!(id.info(), info.filter(|i| !i.is_empty()));
            let inline = matches!(id.0, Repr::Inline { .. });
            assert_eq!(
                inline,
                sub.len() <= INLINE && id.info().is_none(),
                "{sub:?}"
            );
        }
    }
}
