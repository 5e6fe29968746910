//! Hop-by-hop header fields (RFC 9110 section 7.6.1): which of a message's fields a proxy
//! passes on.
//!
//! A field belongs to one hop when its name is one of the connection-management fields
//! (`Connection`, `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`, plus
//! `Trailer` and the `Proxy-Authenticate`/`Proxy-Authorization` pair), or when the message's own
//! `Connection` field names it: `Connection: close, X-Foo` makes `X-Foo` hop-by-hop for that
//! message. A proxy that forwarded such a field would hand the next hop something the sender
//! meant only for the proxy.

/// Fields that are hop-by-hop whatever `Connection` says. `Transfer-Encoding` is here because
/// the proxy frames the body it sends itself.
const ALWAYS: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Whether `name` is a connection-management field, hop-by-hop in every message.
pub fn is_connection_field(name: &str) -> bool {
    ALWAYS.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// The hop-by-hop fields of one message: built from its header fields, it answers for each
/// field whether a proxy forwards it.
#[derive(Debug, Default)]
pub struct HopByHop<'a> {
    /// The values of the message's `Connection` fields, searched for each question (a message
    /// has one or two, each a short list, so there is nothing to gain by splitting them once).
    connection: Vec<&'a [u8]>,
}

impl<'a> HopByHop<'a> {
    /// The hop-by-hop fields of a message with header fields `headers`.
    pub fn new<N, V>(headers: &'a [(N, V)]) -> HopByHop<'a>
    where
        N: AsRef<str>,
        V: AsRef<[u8]>,
    {
        HopByHop {
            connection: headers
                .iter()
                .filter(|(n, _)| n.as_ref().eq_ignore_ascii_case("connection"))
                .map(|(_, v)| v.as_ref())
                .collect(),
        }
    }

    /// Whether the message's `Connection` fields list `token` (case-insensitive; a comma list
    /// with optional whitespace around each element).
    pub fn connection_has(&self, token: &str) -> bool {
        !token.is_empty()
            && self.connection.iter().any(|v| {
                v.split(|&b| b == b',')
                    .any(|item| trim_ows(item).eq_ignore_ascii_case(token.as_bytes()))
            })
    }

    /// Whether a proxy removes the field `name` before passing the message on.
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        is_connection_field(name) || self.connection_has(name)
    }

    /// Whether a proxy passes the field `name` on.
    pub fn forwards(&self, name: &str) -> bool {
        !self.is_hop_by_hop(name)
    }
}

/// `item` without the optional whitespace (spaces and tabs) around it.
fn trim_ows(item: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = item.iter().position(|b| !is_ows(b)).unwrap_or(item.len());
    let end = item
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    item.get(start..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded<'h>(headers: &'h [(&'h str, &'h str)]) -> Vec<&'h str> {
        let hop = HopByHop::new(headers);
        headers
            .iter()
            .filter(|(n, _)| hop.forwards(n))
            .map(|(n, _)| *n)
            .collect()
    }

    #[test]
    fn connection_tokens_are_hop_by_hop() {
        let h = [
            ("Host", "a"),
            ("Connection", "close, X-Foo"),
            ("X-Foo", "1"),
            ("X-Bar", "2"),
        ];
        assert_eq!(forwarded(&h), ["Host", "X-Bar"]);
    }

    #[test]
    fn tokens_are_case_insensitive_with_optional_whitespace_in_every_field() {
        let h = [
            ("connection", "keep-alive,x-one ,\tX-TWO\t, ,"),
            ("CONNECTION", " x-three"),
            ("X-One", "1"),
            ("x-two", "2"),
            ("X-Three", "3"),
            ("X-Four", "4"),
            ("Keep-Alive", "timeout=5"),
        ];
        assert_eq!(forwarded(&h), ["X-Four"]);
        let hop = HopByHop::new(&h);
        assert!(hop.connection_has("KEEP-ALIVE"));
        assert!(!hop.connection_has("close"));
        assert!(!hop.connection_has(""), "empty list elements name nothing");
    }

    #[test]
    fn connection_management_fields_never_pass() {
        let h = [
            ("Connection", "upgrade"),
            ("Proxy-Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "websocket"),
            ("Trailer", "X"),
            ("Proxy-Authorization", "Basic x"),
            ("Proxy-Authenticate", "Basic"),
            ("Content-Type", "text/plain"),
        ];
        assert_eq!(forwarded(&h), ["Content-Type"]);
        assert!(is_connection_field("te"));
        assert!(!is_connection_field("Content-Length"));
    }

    #[test]
    fn works_over_owned_fields_and_byte_values() {
        let owned = vec![
            (String::from("Connection"), b"X-Gone".to_vec()),
            (String::from("X-Gone"), b"1".to_vec()),
            (String::from("X-Kept"), vec![0xff]),
        ];
        let hop = HopByHop::new(&owned);
        assert!(hop.is_hop_by_hop("x-gone"));
        assert!(hop.forwards("X-Kept"));
        let none: [(&str, &[u8]); 0] = [];
        assert!(HopByHop::new(&none).forwards("X-Gone"));
    }

    #[test]
    fn trims_only_optional_whitespace() {
        assert_eq!(trim_ows(b" \ta b\t "), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        assert_eq!(trim_ows(b""), b"");
    }
}
