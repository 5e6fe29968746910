//! Pushpin's routes file: which backend serves which client requests.
//!
//! One route per line, `#` starts a comment:
//!
//! ```text
//! <condition>[,<param>...] <target>[,<param>...] [<target>...]
//! ```
//!
//! The condition is `*` (any host), a host name (`example.com`, matched without its port and
//! case-insensitively) or a suffix pattern (`*.example.com`). Condition parameters: `path_beg=`
//! (the request path must start with it), `path_rem=N` (remove that many leading characters
//! before forwarding), `replace_beg=` (then put this in front), `proto=http|ws`, `sig_key=` (a
//! `base64:` prefix means the key is base64), `sig_iss=`, `id=`, and the flags `debug` and
//! `session` (accepted, ignored). A target is `host:port` with the parameters `over_http`
//! (WebSocket clients are relayed with WebSocket-over-HTTP) and `host=` (the `Host` header sent
//! to the backend). Several targets are tried in turn when one cannot be reached.
//!
//! Matching: routes for a named host come before `*` routes, a longer `path_beg` before a
//! shorter one, and otherwise the first line wins. This is the order Pushpin resolves them in for
//! the usual files (one route per path prefix).

use std::fmt;

use base64::Engine as _;

/// Which requests a route takes, by protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// Plain HTTP requests only.
    Http,
    /// WebSocket upgrades only.
    Ws,
}

/// Where requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` of the backend.
    pub addr: String,
    /// WebSocket clients are relayed to this backend with WebSocket-over-HTTP.
    pub over_http: bool,
    /// The `Host` header to send, instead of the client's.
    pub host_header: Option<String>,
}

/// One line of the routes file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The line it came from (1-based), for logs.
    pub line: usize,
    /// `None` for `*`; a lowercase host name, or `.example.com` for `*.example.com`.
    pub host: Option<String>,
    /// The prefix the request path must start with.
    pub path_beg: Option<String>,
    /// Leading characters removed from the path before forwarding.
    pub path_rem: usize,
    /// Put in front of the path (after `path_rem`).
    pub replace_beg: Option<String>,
    /// Only plain HTTP, or only WebSocket requests.
    pub proto: Option<Proto>,
    /// Key for signing `Grip-Sig` on requests of this route.
    pub sig_key: Option<Vec<u8>>,
    /// Issuer claim of `Grip-Sig`.
    pub sig_iss: Option<String>,
    /// The route's name (`id=`), for logs.
    pub id: Option<String>,
    /// Backends, tried in order.
    pub targets: Vec<Target>,
}

/// A line the parser could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.why)
    }
}

impl std::error::Error for RouteError {}

/// Parses a whole routes file.
pub fn parse_routes(text: &str) -> Result<Vec<Route>, RouteError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        out.push(parse_line(line, i + 1).map_err(|why| RouteError { line: i + 1, why })?);
    }
    Ok(out)
}

fn parse_line(line: &str, number: usize) -> Result<Route, String> {
    let mut words = line.split_whitespace();
    let condition = words.next().ok_or("empty route")?;
    let mut parts = condition.split(',');
    let host = match parts.next().unwrap_or_default() {
        "*" => None,
        h if h.starts_with("*.") && h.len() > 2 => Some(h[1..].to_ascii_lowercase()),
        h if !h.is_empty() && !h.contains('*') && !h.contains('/') => {
            Some(h.split(':').next().unwrap_or(h).to_ascii_lowercase())
        }
        h => {
            return Err(format!(
                "invalid host condition {h:?} (use *, a host or *.domain)"
            ))
        }
    };
    let mut route = Route {
        line: number,
        host,
        path_beg: None,
        path_rem: 0,
        replace_beg: None,
        proto: None,
        sig_key: None,
        sig_iss: None,
        id: None,
        targets: Vec::new(),
    };
    for p in parts {
        let (name, value) = match p.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (p, None),
        };
        match (name, value) {
            ("path_beg", Some(v)) if v.starts_with('/') => route.path_beg = Some(v.to_string()),
            ("path_rem", Some(v)) => {
                route.path_rem = v
                    .parse()
                    .map_err(|_| format!("path_rem={v:?} is not a number"))?;
            }
            ("replace_beg", Some(v)) => route.replace_beg = Some(v.to_string()),
            ("proto", Some("http")) => route.proto = Some(Proto::Http),
            ("proto", Some("ws")) => route.proto = Some(Proto::Ws),
            ("sig_key", Some(v)) => route.sig_key = Some(decode_key(v)?),
            ("sig_iss", Some(v)) => route.sig_iss = Some(v.to_string()),
            ("id", Some(v)) => route.id = Some(v.to_string()),
            ("debug" | "session", None) => {}
            _ => return Err(format!("unsupported route parameter {p:?}")),
        }
    }
    for word in words {
        route.targets.push(parse_target(word)?);
    }
    if route.targets.is_empty() {
        return Err("no target (host:port) after the condition".into());
    }
    Ok(route)
}

fn parse_target(word: &str) -> Result<Target, String> {
    let mut parts = word.split(',');
    let addr = parts.next().unwrap_or_default();
    let port_ok = addr
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok {
        return Err(format!("invalid target {addr:?} (want host:port)"));
    }
    let mut t = Target {
        addr: addr.to_string(),
        over_http: false,
        host_header: None,
    };
    for p in parts {
        match p.split_once('=') {
            None if p == "over_http" => t.over_http = true,
            Some(("host", h)) if !h.is_empty() => t.host_header = Some(h.to_string()),
            None if p == "ssl" => {
                return Err(format!(
                    "target {addr}: TLS to backends (ssl) is not supported; use a local backend"
                ))
            }
            _ => return Err(format!("unsupported target parameter {p:?}")),
        }
    }
    Ok(t)
}

fn decode_key(v: &str) -> Result<Vec<u8>, String> {
    match v.strip_prefix("base64:") {
        Some(b) => super::BASE64
            .decode(b)
            .map_err(|_| "sig_key=base64:... is not valid base64".to_string()),
        None => Ok(v.as_bytes().to_vec()),
    }
}

impl Route {
    fn host_matches(&self, host: &str) -> bool {
        match &self.host {
            None => true,
            Some(h) if h.starts_with('.') => host.ends_with(h.as_str()),
            Some(h) => h == host,
        }
    }

    /// The path to send to the backend for a client's `path` (which this route matched).
    pub fn backend_path<'p>(&self, path: &'p str) -> std::borrow::Cow<'p, str> {
        let rest = path
            .get(self.path_rem.min(path.len())..)
            .unwrap_or_default();
        match &self.replace_beg {
            Some(p) => format!("{p}{rest}").into(),
            None if self.path_rem == 0 => path.into(),
            None if rest.starts_with('/') => rest.into(),
            None => format!("/{rest}").into(),
        }
    }
}

/// The route for a request to `host` (the `Host` header, port included or not) and `path`,
/// `ws` when it is a WebSocket upgrade.
pub fn find_route<'r>(routes: &'r [Route], host: &str, path: &str, ws: bool) -> Option<&'r Route> {
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') {
            h
        } else {
            host
        }
    });
    let host = host.to_ascii_lowercase();
    let proto = if ws { Proto::Ws } else { Proto::Http };
    routes
        .iter()
        .filter(|r| r.host_matches(&host))
        .filter(|r| r.proto.is_none_or(|p| p == proto))
        .filter(|r| r.path_beg.as_deref().is_none_or(|p| path.starts_with(p)))
        // Most specific first: a named host, then the longest prefix; ties keep file order.
        .min_by_key(|r| {
            (
                r.host.is_none(),
                usize::MAX - r.path_beg.as_deref().map_or(0, str::len),
            )
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn parses_pushpin_style_lines() {
        let routes = parse_routes(
            "# comment\n\
             * 127.0.0.1:9000\n\
             *,path_beg=/ws,path_rem=3 localhost:9001,over_http localhost:9002\n\
             Example.COM:8080,sig_key=base64:c2VjcmV0,sig_iss=me,id=ex 10.0.0.1:80,host=api.local\n\
             *.test.org,proto=ws,debug 127.0.0.1:1  # trailing\n",
        )
        .unwrap();
        assert_eq!(routes.len(), 4);
        assert_eq!(routes[0].host, None);
        assert_eq!(routes[0].targets[0].addr, "127.0.0.1:9000");
        assert_eq!(routes[1].path_beg.as_deref(), Some("/ws"));
        assert_eq!(routes[1].path_rem, 3);
        assert!(routes[1].targets[0].over_http);
        assert!(!routes[1].targets[1].over_http);
        assert_eq!(routes[2].host.as_deref(), Some("example.com"));
        assert_eq!(routes[2].sig_key.as_deref(), Some(&b"secret"[..]));
        assert_eq!(routes[2].sig_iss.as_deref(), Some("me"));
        assert_eq!(
            routes[2].targets[0].host_header.as_deref(),
            Some("api.local")
        );
        assert_eq!(routes[3].host.as_deref(), Some(".test.org"));
        assert_eq!(routes[3].proto, Some(Proto::Ws));
        assert_eq!(routes[3].line, 5);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, needle) in [
            ("*", "no target"),
            ("* localhost", "invalid target"),
            ("* localhost:0", "invalid target"),
            ("*,bogus=1 a:1", "unsupported route parameter"),
            ("* a:1,ssl", "not supported"),
            ("* a:1,weird", "unsupported target parameter"),
            ("*,path_rem=x a:1", "not a number"),
            ("a*b a:1", "invalid host"),
            ("*,sig_key=base64:@@ a:1", "base64"),
        ] {
            let e = parse_routes(&format!("\n{text}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{text}");
            assert!(e.why.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn most_specific_route_wins() {
        let routes = parse_routes(
            "* a:1\n\
             *,path_beg=/api b:1\n\
             *,path_beg=/api/v2 c:1\n\
             example.com d:1\n\
             *.example.org e:1\n\
             *,path_beg=/ws,proto=ws f:1\n",
        )
        .unwrap();
        let pick = |host, path, ws| {
            find_route(&routes, host, path, ws).unwrap().targets[0]
                .addr
                .clone()
        };
        assert_eq!(pick("x", "/", false), "a:1");
        assert_eq!(pick("x", "/api/x", false), "b:1");
        assert_eq!(pick("x:8080", "/api/v2/x", false), "c:1");
        assert_eq!(pick("Example.com:443", "/api", false), "d:1");
        assert_eq!(pick("www.example.org", "/", false), "e:1");
        assert_eq!(pick("x", "/ws", true), "f:1");
        assert_eq!(pick("x", "/ws", false), "a:1");
        assert_eq!(pick("[::1]:80", "/", false), "a:1");
        let none = parse_routes("example.com a:1").unwrap();
        assert!(find_route(&none, "other", "/", false).is_none());
    }

    #[test]
    fn backend_paths() {
        let r = |line: &str| parse_routes(line).unwrap().remove(0);
        assert_eq!(r("* a:1").backend_path("/x?y"), "/x?y");
        assert_eq!(
            r("*,path_beg=/api,path_rem=4 a:1").backend_path("/api/x"),
            "/x"
        );
        assert_eq!(
            r("*,path_beg=/api,path_rem=4 a:1").backend_path("/api"),
            "/"
        );
        assert_eq!(
            r("*,path_beg=/api,path_rem=4,replace_beg=/v1 a:1").backend_path("/api/x"),
            "/v1/x"
        );
    }
}
