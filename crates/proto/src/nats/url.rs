//! NATS server URLs as given in configuration: `nats://[user:pass@]host[:port]`, several
//! separated by commas (the servers of one cluster, tried in turn).
//!
//! A user part without a password is a token (`nats://TOKEN@host`), as NATS clients read it.
//! The user part may be percent-encoded (`%40` for `@`). An IPv6 host is bracketed
//! (`nats://[::1]:4222`). The port defaults to 4222. `tls://` is refused: Clarion's link is
//! plain TCP, meant for a broker on a private network or loopback.

use std::fmt;

/// The port a NATS server listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 4222;

/// One server to connect to.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// Host name or address (an IPv6 address without its brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// User name for `CONNECT`, with its password.
    pub user: Option<String>,
    /// Password for `CONNECT`.
    pub pass: Option<String>,
    /// Token for `CONNECT`.
    pub token: Option<String>,
}

/// `nats://host:port`, with the user shown and any password or token hidden, so a URL can be
/// logged.
impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nats://")?;
        match (&self.user, &self.token) {
            (Some(user), _) => write!(f, "{user}:***@")?,
            (None, Some(_)) => f.write_str("***@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Debug output is the redacted [`Display`](fmt::Display) form: credentials never reach a log.
impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerUrl({self})")
    }
}

impl ServerUrl {
    /// `host:port` as a socket address string (IPv6 bracketed), for name resolution.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Why a server URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// No URL at all, or an empty item between commas.
    #[error("empty NATS server URL")]
    Empty,
    /// A scheme other than `nats://`.
    #[error("unsupported scheme {0:?} (only nats:// is supported; TLS is not)")]
    Scheme(String),
    /// No host, or a malformed bracketed IPv6 host.
    #[error("NATS server URL has no valid host")]
    Host,
    /// A port that is not a number from 1 to 65535.
    #[error("NATS server URL has a bad port")]
    Port,
    /// A path, query or fragment after the address.
    #[error("NATS server URL may not have a path, query or fragment")]
    Path,
    /// A bad percent escape or a non-UTF-8 result in the user part.
    #[error("NATS server URL has a bad percent escape in its user part")]
    Escape,
}

/// Parses a comma-separated list of server URLs (at least one).
pub fn parse_servers(list: &str) -> Result<Vec<ServerUrl>, UrlError> {
    list.split(',')
        .map(|one| parse_server(one.trim()))
        .collect()
}

/// Parses one server URL.
pub fn parse_server(url: &str) -> Result<ServerUrl, UrlError> {
    if url.is_empty() {
        return Err(UrlError::Empty);
    }
    let rest = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("nats") => rest,
        Some((scheme, _)) => return Err(UrlError::Scheme(scheme.to_owned())),
        None => url,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(UrlError::Path);
    }
    let (userinfo, hostport) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or(UrlError::Host)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(UrlError::Host)?),
        };
        (host, port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(UrlError::Host);
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or(UrlError::Port)?,
        Some(_) => return Err(UrlError::Port),
    };
    let mut out = ServerUrl {
        host: host.to_owned(),
        port,
        user: None,
        pass: None,
        token: None,
    };
    match userinfo.map(|u| u.split_once(':')) {
        None => {}
        Some(Some((user, pass))) => {
            out.user = Some(percent_decode(user)?);
            out.pass = Some(percent_decode(pass)?);
        }
        Some(None) => out.token = userinfo.map(percent_decode).transpose()?,
    }
    Ok(out)
}

fn percent_decode(text: &str) -> Result<String, UrlError> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [
                bytes.next().ok_or(UrlError::Escape)?,
                bytes.next().ok_or(UrlError::Escape)?,
            ];
            let hex = std::str::from_utf8(&hex).map_err(|_| UrlError::Escape)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| UrlError::Escape)?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::Escape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_lists() {
        let list = parse_servers("nats://127.0.0.1:4223, nats://b.example , c").expect("valid");
        assert_eq!(
            list.iter().map(ServerUrl::address).collect::<Vec<_>>(),
            ["127.0.0.1:4223", "b.example:4222", "c:4222"]
        );
        assert!(list.iter().all(|u| u.user.is_none() && u.token.is_none()));
        let v6 = parse_server("nats://[::1]:5000/").expect("valid");
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 5000));
        assert_eq!(v6.address(), "[::1]:5000");
        assert_eq!(parse_server("NATS://[::1]").map(|u| u.port), Ok(4222));
    }

    #[test]
    fn credentials() {
        let u = parse_server("nats://al%40ice:p%3Ass@h:1").expect("valid");
        assert_eq!(u.user.as_deref(), Some("al@ice"));
        assert_eq!(u.pass.as_deref(), Some("p:ss"));
        assert_eq!(u.token, None);
        assert_eq!(u.to_string(), "nats://al@ice:***@h:1");
        assert!(!format!("{u:?}").contains("p:ss"));
        let t = parse_server("nats://s3cret@h").expect("valid");
        assert_eq!(t.token.as_deref(), Some("s3cret"));
        assert_eq!(t.to_string(), "nats://***@h:4222");
    }

    #[test]
    fn refusals() {
        for (url, want) in [
            ("", UrlError::Empty),
            ("nats://a,", UrlError::Empty),
            ("tls://a:1", UrlError::Scheme("tls".into())),
            ("redis://a", UrlError::Scheme("redis".into())),
            ("nats://", UrlError::Host),
            ("nats://:4222", UrlError::Host),
            ("nats://[::1", UrlError::Host),
            ("nats://[::1]x", UrlError::Host),
            ("nats://a:0", UrlError::Port),
            ("nats://a:65536", UrlError::Port),
            ("nats://a:", UrlError::Port),
            ("nats://a:+1", UrlError::Port),
            ("nats://a:1/x", UrlError::Path),
            ("nats://a?x", UrlError::Path),
            ("nats://u:%zz@a", UrlError::Escape),
            ("nats://u:%f@a", UrlError::Escape),
            ("nats://%ff@a", UrlError::Escape),
        ] {
            assert_eq!(parse_servers(url), Err(want), "{url}");
        }
    }
}
