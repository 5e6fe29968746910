//! Where an HTTP API lives, as users type it: `host:port`, `http://host:port`,
//! `https://host:port` or `http://host:port/prefix/`. `clarion publish --api` and `clarion bench
//! --api` take the same forms through this one parser; resolving the host, and refusing
//! `https://` where TLS is not spoken, is the caller's business (this module does no I/O).

/// A parsed API location: the authority to connect to and send as `Host`, and the path prefix
/// every request target starts with (empty, or `/prefix` without a trailing slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// `host:port` (`[v6]:port` for IPv6 literals), as given; port 80 added for `http://host`,
    /// 443 for `https://host`.
    pub authority: String,
    /// The path prefix, `""` or `/something` (never ending in `/`).
    pub prefix: String,
    /// `https://`: the API is reached over TLS.
    pub tls: bool,
}

impl BaseUrl {
    /// The host alone, without the port or an IPv6 literal's brackets: the name a TLS
    /// certificate must cover.
    pub fn host(&self) -> &str {
        let a = self.authority.as_str();
        let host = a.rfind(':').map_or(a, |i| &a[..i]);
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }
}

/// Why an API location was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BaseUrlError {
    /// Empty input.
    #[error("the API address is empty (give host:port, http://host:port or https://host:port)")]
    Empty,
    /// Another scheme (`ws://`, `ftp://`).
    #[error("unsupported scheme {0:?}: give host:port, http://host:port or https://host:port")]
    Scheme(String),
    /// A bare `host` without `:port` (with `http://` the port defaults to 80).
    #[error("{0:?} has no port: give host:port or http://host:port")]
    NoPort(String),
    /// The port is not a number from 1 to 65535.
    #[error("{0:?} has an invalid port")]
    Port(String),
    /// Characters that cannot be in a host, a query or a fragment, or user information.
    #[error("{0:?} is not a host:port or http://host:port[/prefix] address")]
    Malformed(String),
}

/// Parses `host:port`, `http://host[:port][/prefix][/]` and the same with `https://`.
pub fn parse_base_url(input: &str) -> Result<BaseUrl, BaseUrlError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(BaseUrlError::Empty);
    }
    let (scheme, rest) = match s.find("://") {
        Some(i) => (Some(s[..i].to_ascii_lowercase()), &s[i + 3..]),
        None => (None, s),
    };
    match scheme.as_deref() {
        None | Some("http") | Some("https") => {}
        Some(other) => return Err(BaseUrlError::Scheme(other.to_owned())),
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let malformed = || BaseUrlError::Malformed(input.to_owned());
    if authority.is_empty()
        || path.contains(['?', '#'])
        || authority.contains(['@', '?', '#'])
        || s.bytes().any(|b| b <= b' ' || b == 0x7f)
    {
        return Err(malformed());
    }
    if scheme.is_none() && !path.is_empty() {
        return Err(malformed());
    }
    let tls = scheme.as_deref() == Some("https");
    // The port follows the last ':' outside an IPv6 literal's brackets.
    let host_end = if authority.starts_with('[') {
        authority.find(']').map(|i| i + 1).ok_or_else(malformed)?
    } else {
        authority.find(':').unwrap_or(authority.len())
    };
    let (host, port) = authority.split_at(host_end);
    if host.is_empty() || host == "[]" {
        return Err(malformed());
    }
    let authority = match port.strip_prefix(':') {
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && !p.starts_with('+') => authority.to_owned(),
            _ => return Err(BaseUrlError::Port(input.to_owned())),
        },
        None if port.is_empty() && tls => format!("{host}:443"),
        None if port.is_empty() && scheme.is_some() => format!("{host}:80"),
        None if port.is_empty() => return Err(BaseUrlError::NoPort(input.to_owned())),
        None => return Err(malformed()),
    };
    Ok(BaseUrl {
        authority,
        prefix: path.trim_end_matches('/').to_owned(),
        tls,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ok(s: &str) -> (String, String) {
        let b = parse_base_url(s).unwrap();
        (b.authority, b.prefix)
    }

    #[test]
    fn both_forms_give_the_same_address() {
        let plain = ("127.0.0.1:8081".to_owned(), String::new());
        assert_eq!(ok("127.0.0.1:8081"), plain);
        assert_eq!(ok("http://127.0.0.1:8081"), plain);
        assert_eq!(ok("http://127.0.0.1:8081/"), plain);
        assert_eq!(ok("HTTP://127.0.0.1:8081"), plain);
        assert_eq!(ok("localhost:8081").0, "localhost:8081");
        assert_eq!(ok("[::1]:8081").0, "[::1]:8081");
        assert_eq!(ok("http://[::1]:8081/").0, "[::1]:8081");
        assert_eq!(ok("http://api.internal").0, "api.internal:80");
        assert_eq!(
            ok("http://10.0.0.5:8081/clarion/"),
            ("10.0.0.5:8081".to_owned(), "/clarion".to_owned())
        );
    }

    #[test]
    fn https_is_parsed_with_its_port_and_host() {
        let b = parse_base_url("https://localhost:8443/api/").unwrap();
        assert_eq!(
            (b.authority.as_str(), b.prefix.as_str(), b.tls, b.host()),
            ("localhost:8443", "/api", true, "localhost")
        );
        let b = parse_base_url("HTTPS://[::1]").unwrap();
        assert_eq!((b.authority.as_str(), b.host()), ("[::1]:443", "::1"));
        assert!(!parse_base_url("127.0.0.1:8081").unwrap().tls);
    }

    #[test]
    fn what_cannot_work_is_refused_with_its_reason() {
        assert_eq!(parse_base_url(""), Err(BaseUrlError::Empty));
        assert_eq!(
            parse_base_url("ws://h:1"),
            Err(BaseUrlError::Scheme("ws".into()))
        );
        assert!(matches!(
            parse_base_url("localhost"),
            Err(BaseUrlError::NoPort(_))
        ));
        for bad_port in ["h:0", "h:65536", "h:x", "h:", "h:+80"] {
            assert!(
                matches!(parse_base_url(bad_port), Err(BaseUrlError::Port(_))),
                "{bad_port}"
            );
        }
        for bad in [
            "h:1/path",
            "http://u@h:1",
            "http://h:1/?x",
            "http://h 1:2",
            "http://:80",
            "http://[::1:80",
            "[::1]x",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }
}
