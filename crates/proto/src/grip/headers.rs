//! GRIP instructions: the `Grip-*` headers of a backend's response that tell the proxy what to
//! do with the client's request.
//!
//! `Grip-Hold` (`response` for a long-poll, `stream` for a stream) turns the proxy's behaviour on;
//! without it the response is relayed as it is. The other headers refine it: the channels to
//! subscribe (`Grip-Channel`, with `prev-id` and `filter` parameters), how long to hold a
//! long-poll (`Grip-Timeout`), what to send on an idle stream (`Grip-Keep-Alive`), the status to
//! answer with (`Grip-Status`), follow-up links (`Grip-Link`), connection metadata
//! (`Grip-Set-Meta`) and which of the backend's headers reach the client (`Grip-Expose-Headers`).
//!
//! Parameterised values follow the usual HTTP list syntax: comma-separated items, each a value and
//! `; name=value` parameters, values as tokens or quoted strings. Everything here works on header
//! values already split from the head; nothing is trusted, and a bad value is an error naming the
//! header, never a panic.

use super::params::{is_token, parse_list, parse_pairs, Item};
use super::BASE64;
use base64::Engine;

/// How long a long-poll is held when the backend gives no `Grip-Timeout`, in seconds (the
/// protocol's suggested default).
pub const DEFAULT_HOLD_TIMEOUT_SECS: u32 = 55;

/// How long a stream may stay idle before the keep-alive data is sent, when `Grip-Keep-Alive`
/// gives no `timeout` (the protocol's suggested default).
pub const DEFAULT_KEEP_ALIVE_SECS: u32 = 55;

/// How long a `rel=next` link waits before it is followed when it gives no `timeout` (Pushpin's).
pub const DEFAULT_NEXT_LINK_SECS: u32 = 120;

/// Most channels one response may subscribe a request to: the server's default cap on one
/// connection's subscriptions, as each channel costs the hub one.
pub const MAX_CHANNELS: usize = 64;

/// Most `filter` parameters on one channel: filters run on every delivery.
pub const MAX_FILTERS: usize = 8;

/// How the proxy holds the client's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldMode {
    /// `response`: a long-poll, answered by the first publish (or the timeout).
    Response,
    /// `stream`: the response stays open and every publish is appended to it.
    Stream,
}

/// One channel the request is subscribed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// The channel's name.
    pub name: String,
    /// The id of the last item the backend knows was published to it (`prev-id`), so a publish
    /// racing with the response is not lost.
    pub prev_id: Option<String>,
    /// Filters to apply to deliveries on this channel, in order (`filter`).
    pub filters: Vec<String>,
}

/// When the keep-alive data is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAliveMode {
    /// After the stream has been idle for the timeout (the default).
    Idle,
    /// Every timeout, whatever else is sent.
    Interval,
}

/// What `Grip-Keep-Alive` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepAlive {
    /// The bytes to send, decoded from the header's `format`.
    pub data: Vec<u8>,
    /// Seconds of idleness (or the interval) before they are sent.
    pub timeout_secs: u32,
    /// When they are sent.
    pub mode: KeepAliveMode,
}

/// A status line that replaces the backend's (`Grip-Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The status code, 100 to 999.
    pub code: u16,
    /// The reason phrase, if one was given.
    pub reason: Option<String>,
}

/// A `Grip-Link` with `rel=next`: where to fetch what follows this response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextLink {
    /// The link as written between `<` and `>` (possibly relative to the request).
    pub uri: String,
    /// Seconds to wait before following it.
    pub timeout_secs: u32,
}

/// Every GRIP instruction found in a response's headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instruct {
    /// `Grip-Hold`: `None` means the response is relayed as is.
    pub hold: Option<HoldMode>,
    /// `Grip-Channel`, in order, from every such header.
    pub channels: Vec<Channel>,
    /// `Grip-Timeout` in seconds, if given (see [`DEFAULT_HOLD_TIMEOUT_SECS`]).
    pub timeout_secs: Option<u32>,
    /// `Grip-Keep-Alive`, if given.
    pub keep_alive: Option<KeepAlive>,
    /// `Grip-Status`, if given.
    pub status: Option<Status>,
    /// `Grip-Link` with `rel=next`, if given.
    pub next_link: Option<NextLink>,
    /// `Grip-Link` with `rel=gone`: notified when the client goes away.
    pub gone_link: Option<String>,
    /// `Grip-Set-Meta` fields, in order (a later value for the same name wins).
    pub set_meta: Vec<(String, String)>,
    /// `Grip-Expose-Headers`: if not empty, only these backend headers reach the client.
    pub expose_headers: Vec<String>,
}

impl Instruct {
    /// The long-poll timeout to use: the backend's or [`DEFAULT_HOLD_TIMEOUT_SECS`].
    pub fn hold_timeout_secs(&self) -> u32 {
        self.timeout_secs.unwrap_or(DEFAULT_HOLD_TIMEOUT_SECS)
    }
}

/// Why a response's GRIP instructions were refused. Each names the header at fault; the proxy
/// answers the client with 502, as for any other bad backend response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstructError {
    /// A `Grip-*` header's value is not UTF-8.
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    /// `Grip-Hold` is neither `response` nor `stream`.
    #[error("Grip-Hold must be 'response' or 'stream'")]
    InvalidHold,
    /// `Grip-Hold` is present but no channel is named.
    #[error("Grip-Hold without Grip-Channel")]
    NoChannel,
    /// A `Grip-Channel` item does not parse or has an empty name.
    #[error("malformed Grip-Channel")]
    InvalidChannel,
    /// More channels than [`MAX_CHANNELS`].
    #[error("too many channels")]
    TooManyChannels,
    /// A channel with more filters than [`MAX_FILTERS`].
    #[error("too many filters on one channel")]
    TooManyFilters,
    /// `Grip-Timeout` is not a number of seconds.
    #[error("malformed Grip-Timeout")]
    InvalidTimeout,
    /// `Grip-Keep-Alive` does not parse, or its data does not decode in its format.
    #[error("malformed Grip-Keep-Alive: {0}")]
    InvalidKeepAlive(&'static str),
    /// `Grip-Status` is not a three-digit code optionally followed by a reason.
    #[error("malformed Grip-Status")]
    InvalidStatus,
    /// `Grip-Link` is not `<uri>` with a `rel` (and, for `next`, a numeric `timeout`).
    #[error("malformed Grip-Link")]
    InvalidLink,
    /// `Grip-Set-Meta` is not a list of `name=value`.
    #[error("malformed Grip-Set-Meta")]
    InvalidSetMeta,
    /// `Grip-Expose-Headers` names something that is not a header name.
    #[error("malformed Grip-Expose-Headers")]
    InvalidExposeHeaders,
}

/// Reads every GRIP instruction from a response's headers (name, value pairs, as in
/// [`crate::http1::RequestHead::headers`]). Header names are matched case-insensitively; a
/// single-valued header given twice is read from its first occurrence.
pub fn parse_instruct(headers: &[(&str, &[u8])]) -> Result<Instruct, InstructError> {
    let mut out = Instruct::default();
    let first = |name: &'static str| -> Result<Option<&str>, InstructError> {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| std::str::from_utf8(v).map_err(|_| InstructError::NotUtf8(name)))
            .transpose()
    };
    let all = |name: &'static str| {
        headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(move |(_, v)| std::str::from_utf8(v).map_err(|_| InstructError::NotUtf8(name)))
    };

    if let Some(hold) = first("Grip-Hold")? {
        out.hold = Some(match hold.trim() {
            "response" => HoldMode::Response,
            "stream" => HoldMode::Stream,
            _ => return Err(InstructError::InvalidHold),
        });
    }
    for value in all("Grip-Channel") {
        for item in parse_list(value?, true).map_err(|_| InstructError::InvalidChannel)? {
            out.channels.push(channel(item)?);
            if out.channels.len() > MAX_CHANNELS {
                return Err(InstructError::TooManyChannels);
            }
        }
    }
    if out.hold.is_some() && out.channels.is_empty() {
        return Err(InstructError::NoChannel);
    }
    if let Some(timeout) = first("Grip-Timeout")? {
        out.timeout_secs = Some(seconds(timeout.trim()).ok_or(InstructError::InvalidTimeout)?);
    }
    if let Some(value) = first("Grip-Keep-Alive")? {
        out.keep_alive = Some(keep_alive(value)?);
    }
    if let Some(value) = first("Grip-Status")? {
        out.status = Some(status(value.trim()).ok_or(InstructError::InvalidStatus)?);
    }
    for value in all("Grip-Link") {
        for item in parse_list(value?, true).map_err(|_| InstructError::InvalidLink)? {
            link(item, &mut out)?;
        }
    }
    for value in all("Grip-Set-Meta") {
        for (name, value) in parse_pairs(value?).map_err(|_| InstructError::InvalidSetMeta)? {
            out.set_meta.retain(|(n, _)| *n != name);
            out.set_meta.push((name, value));
        }
    }
    for value in all("Grip-Expose-Headers") {
        for item in value?.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !is_token(item) {
                return Err(InstructError::InvalidExposeHeaders);
            }
            out.expose_headers.push(item.to_string());
        }
    }
    Ok(out)
}

fn channel(item: Item) -> Result<Channel, InstructError> {
    if item.value.is_empty() {
        return Err(InstructError::InvalidChannel);
    }
    let mut channel = Channel {
        name: item.value,
        prev_id: None,
        filters: Vec::new(),
    };
    for (name, value) in item.params {
        match (name.as_str(), value) {
            ("prev-id", Some(v)) => channel.prev_id = Some(v),
            ("filter", Some(v)) => {
                channel.filters.push(v);
                if channel.filters.len() > MAX_FILTERS {
                    return Err(InstructError::TooManyFilters);
                }
            }
            ("prev-id" | "filter", None) => return Err(InstructError::InvalidChannel),
            // Parameters from later versions of the protocol are ignored, as HTTP does.
            _ => {}
        }
    }
    Ok(channel)
}

fn keep_alive(value: &str) -> Result<KeepAlive, InstructError> {
    let bad = InstructError::InvalidKeepAlive;
    let mut items = parse_list(value, false).map_err(|_| bad("syntax"))?;
    let item = match (items.pop(), items.is_empty()) {
        (Some(item), true) => item,
        _ => return Err(bad("syntax")),
    };
    if item.value.is_empty() {
        return Err(bad("empty data"));
    }
    let (mut format, mut timeout, mut mode) = (None, None, KeepAliveMode::Idle);
    for (name, value) in item.params {
        match (name.as_str(), value) {
            ("format", Some(v)) => format = Some(v),
            ("timeout", Some(v)) => timeout = Some(seconds(&v).ok_or(bad("timeout"))?),
            ("mode", Some(v)) => {
                mode = match v.as_str() {
                    "idle" => KeepAliveMode::Idle,
                    "interval" => KeepAliveMode::Interval,
                    _ => return Err(bad("unknown mode")),
                }
            }
            ("format" | "timeout" | "mode", None) => return Err(bad("parameter without value")),
            _ => {}
        }
    }
    let data = match format.as_deref() {
        None | Some("raw") => item.value.into_bytes(),
        Some("cstring") => unescape_cstring(&item.value).ok_or(bad("cstring escape"))?,
        Some("base64") => BASE64
            .decode(item.value.as_bytes())
            .map_err(|_| bad("base64"))?,
        Some(_) => return Err(bad("unknown format")),
    };
    Ok(KeepAlive {
        data,
        timeout_secs: timeout.unwrap_or(DEFAULT_KEEP_ALIVE_SECS),
        mode,
    })
}

/// Decodes the `cstring` keep-alive format: `\\`, `\r`, `\n`, `\t`, `\"` and `\xHH`. Any other
/// escape, or a lone backslash at the end, is refused rather than guessed at.
fn unescape_cstring(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next()? {
            b'\\' => b'\\',
            b'r' => b'\r',
            b'n' => b'\n',
            b't' => b'\t',
            b'"' => b'"',
            b'x' => {
                let hi = (bytes.next()? as char).to_digit(16)?;
                let lo = (bytes.next()? as char).to_digit(16)?;
                (hi << 4 | lo) as u8
            }
            _ => return None,
        });
    }
    Some(out)
}

fn status(value: &str) -> Option<Status> {
    let (code, reason) = match value.split_once(' ') {
        Some((code, reason)) => (code, Some(reason.trim())),
        None => (value, None),
    };
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let code: u16 = code.parse().ok()?;
    if code < 100 {
        return None;
    }
    let reason = reason.filter(|r| !r.is_empty());
    if reason.is_some_and(|r| r.chars().any(char::is_control)) {
        return None;
    }
    Some(Status {
        code,
        reason: reason.map(str::to_string),
    })
}

fn link(item: Item, out: &mut Instruct) -> Result<(), InstructError> {
    let uri = item
        .value
        .strip_prefix('<')
        .and_then(|v| v.strip_suffix('>'))
        .filter(|u| !u.is_empty() && !u.chars().any(|c| c.is_whitespace() || c.is_control()))
        .ok_or(InstructError::InvalidLink)?;
    let param = |name: &str| {
        item.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_deref())
    };
    match param("rel").flatten() {
        Some("next") => {
            let timeout_secs = match param("timeout") {
                None => DEFAULT_NEXT_LINK_SECS,
                Some(v) => v.and_then(seconds).ok_or(InstructError::InvalidLink)?,
            };
            out.next_link = Some(NextLink {
                uri: uri.to_string(),
                timeout_secs,
            });
        }
        Some("gone") => out.gone_link = Some(uri.to_string()),
        // Other relations are not GRIP's business.
        Some(_) => {}
        None => return Err(InstructError::InvalidLink),
    }
    Ok(())
}

/// A non-negative number of seconds: digits only.
fn seconds(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(headers: &[(&str, &str)]) -> Result<Instruct, InstructError> {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        parse_instruct(&headers)
    }

    fn ch(name: &str) -> Channel {
        Channel {
            name: name.into(),
            prev_id: None,
            filters: vec![],
        }
    }

    #[test]
    fn no_grip_headers_means_no_instructions() {
        let got = parse(&[("Content-Type", "text/plain")]).unwrap();
        assert_eq!(got, Instruct::default());
        assert_eq!(got.hold_timeout_secs(), DEFAULT_HOLD_TIMEOUT_SECS);
    }

    #[test]
    fn stream_hold_with_channels_and_params() {
        let got = parse(&[
            ("grip-hold", "stream"),
            ("Grip-Channel", "a, b; prev-id=7"),
            (
                "Grip-Channel",
                r#"c; prev-id="x;y\"z"; filter=skip-self; FILTER=build-id"#,
            ),
        ])
        .unwrap();
        assert_eq!(got.hold, Some(HoldMode::Stream));
        assert_eq!(
            got.channels,
            vec![
                ch("a"),
                Channel {
                    prev_id: Some("7".into()),
                    ..ch("b")
                },
                Channel {
                    prev_id: Some("x;y\"z".into()),
                    filters: vec!["skip-self".into(), "build-id".into()],
                    ..ch("c")
                },
            ]
        );
    }

    #[test]
    fn response_hold_with_timeout() {
        let got = parse(&[
            ("Grip-Hold", "response"),
            ("Grip-Channel", "\"quoted, name\""),
            ("Grip-Timeout", "120"),
        ])
        .unwrap();
        assert_eq!(got.hold, Some(HoldMode::Response));
        assert_eq!(got.channels, vec![ch("quoted, name")]);
        assert_eq!(got.hold_timeout_secs(), 120);
    }

    #[test]
    fn hold_errors() {
        assert_eq!(
            parse(&[("Grip-Hold", "poll"), ("Grip-Channel", "a")]),
            Err(InstructError::InvalidHold)
        );
        assert_eq!(
            parse(&[("Grip-Hold", "stream")]),
            Err(InstructError::NoChannel)
        );
        assert_eq!(
            parse(&[("Grip-Hold", "stream"), ("Grip-Channel", " , ")]),
            Err(InstructError::NoChannel)
        );
        for bad in [
            "; prev-id=1",
            "a; prev-id",
            "a; =1",
            "\"open",
            "a; prev-id=\"x",
        ] {
            assert_eq!(
                parse(&[("Grip-Channel", bad)]),
                Err(InstructError::InvalidChannel),
                "{bad}"
            );
        }
        for bad in ["-1", "", "1.5", "+5", "99999999999"] {
            assert_eq!(
                parse(&[("Grip-Timeout", bad)]),
                Err(InstructError::InvalidTimeout),
                "{bad}"
            );
        }
        let headers: [(&str, &[u8]); 1] = [("Grip-Channel", b"\xff")];
        assert_eq!(
            parse_instruct(&headers),
            Err(InstructError::NotUtf8("Grip-Channel"))
        );
    }

    #[test]
    fn channel_and_filter_limits() {
        let names: Vec<String> = (0..=MAX_CHANNELS).map(|i| format!("c{i}")).collect();
        assert_eq!(
            parse(&[("Grip-Channel", &names.join(","))]),
            Err(InstructError::TooManyChannels)
        );
        assert!(parse(&[("Grip-Channel", &names[..MAX_CHANNELS].join(","))]).is_ok());
        let filters = "; filter=f".repeat(MAX_FILTERS + 1);
        assert_eq!(
            parse(&[("Grip-Channel", &format!("a{filters}"))]),
            Err(InstructError::TooManyFilters)
        );
    }

    #[test]
    fn keep_alive_formats() {
        let ka = |v: &str| parse(&[("Grip-Keep-Alive", v)]).map(|i| i.keep_alive.unwrap());
        assert_eq!(
            ka(r"\n; format=cstring; timeout=20").unwrap(),
            KeepAlive {
                data: b"\n".to_vec(),
                timeout_secs: 20,
                mode: KeepAliveMode::Idle
            }
        );
        assert_eq!(ka(":ping").unwrap().data, b":ping");
        assert_eq!(ka(":ping").unwrap().timeout_secs, DEFAULT_KEEP_ALIVE_SECS);
        assert_eq!(ka("x; format=raw").unwrap().data, b"x");
        assert_eq!(
            ka(r#""a\\x00b\\r\\n\\\\"; format=cstring"#).unwrap().data,
            b"a\x00b\r\n\\"
        );
        assert_eq!(ka("AP8=; format=base64").unwrap().data, [0, 255]);
        assert_eq!(ka("AP8; format=base64").unwrap().data, [0, 255]);
        assert_eq!(
            ka("x; mode=interval; timeout=5").unwrap().mode,
            KeepAliveMode::Interval
        );
        for (bad, why) in [
            ("; format=raw", "empty data"),
            (r"\q; format=cstring", "cstring escape"),
            (r"\x4; format=cstring", "cstring escape"),
            (r"a\; format=cstring", "cstring escape"),
            ("!!; format=base64", "base64"),
            ("x; format=hex", "unknown format"),
            ("x; timeout=-1", "timeout"),
            ("x; mode=sometimes", "unknown mode"),
            ("x; format", "parameter without value"),
        ] {
            assert_eq!(ka(bad), Err(InstructError::InvalidKeepAlive(why)), "{bad}");
        }
    }

    #[test]
    fn status_links_meta_and_exposed_headers() {
        let got = parse(&[
            ("Grip-Status", "404 Not Here"),
            (
                "Grip-Link",
                "</poll?since=1;x=2>; rel=next; timeout=30, </gone>; rel=gone",
            ),
            ("Grip-Link", "</other>; rel=prev"),
            ("Grip-Set-Meta", r#"user=alice, role="a, b""#),
            ("Grip-Set-Meta", "user=bob"),
            ("Grip-Expose-Headers", "Content-Type, X-Id"),
        ])
        .unwrap();
        assert_eq!(
            got.status,
            Some(Status {
                code: 404,
                reason: Some("Not Here".into())
            })
        );
        assert_eq!(
            got.next_link,
            Some(NextLink {
                uri: "/poll?since=1;x=2".into(),
                timeout_secs: 30
            })
        );
        assert_eq!(got.gone_link.as_deref(), Some("/gone"));
        assert_eq!(
            got.set_meta,
            vec![
                ("role".into(), "a, b".into()),
                ("user".into(), "bob".into())
            ]
        );
        assert_eq!(got.expose_headers, vec!["Content-Type", "X-Id"]);

        let next = parse(&[("Grip-Link", "</n>; rel=next")]).unwrap();
        assert_eq!(next.next_link.unwrap().timeout_secs, DEFAULT_NEXT_LINK_SECS);
        assert_eq!(
            parse(&[("Grip-Status", "304")]).unwrap().status,
            Some(Status {
                code: 304,
                reason: None
            })
        );
        for bad in ["", "42", "1000", "abc", "20x OK"] {
            assert_eq!(
                parse(&[("Grip-Status", bad)]),
                Err(InstructError::InvalidStatus),
                "{bad}"
            );
        }
        for bad in [
            "/n; rel=next",
            "<>; rel=next",
            "</n>",
            "</n>; rel=next; timeout=x",
            "</a b>; rel=gone",
        ] {
            assert_eq!(
                parse(&[("Grip-Link", bad)]),
                Err(InstructError::InvalidLink),
                "{bad}"
            );
        }
        for bad in ["user", "=x", "a b=c", "k=\"open", "k=v; p=1"] {
            assert_eq!(
                parse(&[("Grip-Set-Meta", bad)]),
                Err(InstructError::InvalidSetMeta),
                "{bad}"
            );
        }
        assert_eq!(
            parse(&[("Grip-Expose-Headers", "Bad Header")]),
            Err(InstructError::InvalidExposeHeaders)
        );
    }

    #[test]
    fn arbitrary_values_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = "ab,;=\"\\<> \tx0é9".as_bytes();
        let names = [
            "Grip-Hold",
            "Grip-Channel",
            "Grip-Timeout",
            "Grip-Keep-Alive",
            "Grip-Status",
            "Grip-Link",
            "Grip-Set-Meta",
            "Grip-Expose-Headers",
        ];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let value: Vec<u8> = (0..(x % 24) as usize)
                .map(|i| alphabet[((x >> (i % 59)) as usize ^ i) % alphabet.len()])
                .collect();
            let name = names[(x % names.len() as u64) as usize];
            let _ = parse_instruct(&[(name, &value)]);
        }
    }
}
