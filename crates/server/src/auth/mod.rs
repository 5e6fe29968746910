//! JWT authentication and topic permissions: the keys (loaded once at startup), the policy
//! (public topics, anonymous connections), where a request's token is found, and the per-worker
//! store of what authenticated connections were granted.
//!
//! Verification itself is sans-IO in [`clarion_proto::auth`]; this module gives it the keys
//! and the time. Transports ask [`Auth`] two questions: who is this request
//! ([`Auth::identify`]) and may it subscribe to a topic ([`Auth::may_subscribe`]). The answers
//! to refuse with are [`Refusal`]s: a status, a short reason and a metrics label. Nothing here
//! logs a token or a URL that may hold one.

pub mod grants;

use std::borrow::Cow;
use std::path::Path;

use clarion_proto::auth::{
    cookie_value, parse_jwks, parse_pem_public_key, Algorithm, Claims, Grants, KeyError, Keys,
    NamedKey, Pattern, TokenError, Verifier,
};
use clarion_proto::http1::authorization::{parse_authorization, Credentials};
use clarion_proto::http1::{self, RequestHead};

use crate::config::Config;
use crate::metrics::Metrics;

/// Why authentication could not be set up; startup stops with it.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// A key file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A key file's content is not a usable key.
    #[error("{path}: {source}")]
    Key {
        /// The file.
        path: String,
        /// What is wrong with it.
        source: KeyError,
    },
    /// Settings that do not fit together.
    #[error("invalid auth settings: {0}")]
    Invalid(String),
}

/// Authentication as configured. Shared, read-only, by every worker and the API.
#[derive(Debug)]
pub struct Auth {
    /// Keys, algorithm, audience, issuer, leeway.
    pub verifier: Verifier,
    /// Topics anyone may subscribe to.
    pub public: Vec<Pattern>,
    /// Whether requests without a token are allowed at all.
    pub anonymous: bool,
    /// Whether the `token` query parameter is read.
    pub query_token: bool,
    /// The cookie that may carry a token.
    pub cookie: Option<String>,
    /// Origins whose pages may send the cookie (`*`: any); the server's own always may.
    pub allowed_origins: Vec<String>,
    /// Seconds before `exp` a WebSocket is warned.
    pub warning: u64,
    /// Largest `clarion.info` accepted, in bytes of JSON (`presence_max_info`).
    pub max_info: usize,
}

/// Why a request or message was refused: the HTTP status (401 or 403), the short reason the
/// client sees, and the `clarion_auth_failures_total` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// 401: no token or a bad one; 403: a valid token without the topic.
    pub status: u16,
    /// What the client is told.
    pub reason: &'static str,
    /// The metrics label.
    pub label: &'static str,
}

impl Refusal {
    /// No token where one is needed.
    pub const MISSING: Refusal = Refusal {
        status: 401,
        reason: "a token is required",
        label: "missing",
    };
    /// A valid token that does not grant the topic.
    pub const FORBIDDEN: Refusal = Refusal {
        status: 403,
        reason: "the token does not grant this topic",
        label: "forbidden",
    };
    /// The token's `clarion.info` is larger than `presence_max_info`.
    pub const INFO_TOO_LARGE: Refusal = Refusal {
        status: 401,
        reason: "the token's clarion.info is larger than presence_max_info",
        label: "claims",
    };
    /// The token cookie sent by a page of another site (see `allowed_origins`).
    pub const FOREIGN_ORIGIN: Refusal = Refusal {
        status: 403,
        reason: "the token cookie is not accepted from this page's origin (allowed_origins)",
        label: "origin",
    };

    /// The token cookie on a browser request that names no `Origin` but says another page
    /// made it (`Sec-Fetch-Site: same-site` or `cross-site`: an `<img>`, a `<script>`, a
    /// no-cors `fetch`).
    pub const FOREIGN_SITE: Refusal = Refusal {
        status: 403,
        reason: "the token cookie is not accepted on a request another page made without an Origin (Sec-Fetch-Site)",
        label: "origin",
    };

    /// A token that failed verification.
    pub fn token(e: TokenError) -> Refusal {
        let reason = match e {
            TokenError::TooLong | TokenError::Malformed => "malformed token",
            TokenError::Algorithm => "token algorithm not accepted",
            TokenError::UnknownKey => "unknown signing key",
            TokenError::Signature => "bad token signature",
            TokenError::MissingExpiry => "token has no exp",
            TokenError::Claims(_) => "invalid token claims",
            TokenError::Expired => "token expired",
            TokenError::NotYetValid => "token not yet valid",
            TokenError::Audience => "token audience not accepted",
            TokenError::Issuer => "token issuer not accepted",
        };
        Refusal {
            status: 401,
            reason,
            label: e.reason(),
        }
    }

    /// The JSON body of an HTTP refusal: `{"error":"..."}`.
    pub fn json(&self) -> String {
        serde_json::json!({ "error": self.reason }).to_string()
    }

    /// Counts it.
    pub fn count(&self, metrics: &Metrics) {
        metrics.auth_failed(self.label);
    }
}

/// The first `auth_*` policy setting changed from its default, for a configuration without a
/// key: a policy that would silently do nothing.
fn policy_without_key(config: &Config) -> Option<&'static str> {
    let d = Config::default();
    let changed = [
        (
            "auth_public_topics",
            config.auth_public_topics != d.auth_public_topics,
        ),
        ("auth_anonymous", config.auth_anonymous != d.auth_anonymous),
        ("auth_audience", config.auth_audience != d.auth_audience),
        ("auth_issuer", config.auth_issuer != d.auth_issuer),
        ("auth_leeway", config.auth_leeway != d.auth_leeway),
        (
            "auth_query_token",
            config.auth_query_token != d.auth_query_token,
        ),
        ("auth_cookie", config.auth_cookie != d.auth_cookie),
        (
            "auth_expiry_warning",
            config.auth_expiry_warning != d.auth_expiry_warning,
        ),
    ];
    changed.iter().find(|(_, c)| *c).map(|(name, _)| *name)
}

/// Who a request or connection is: nobody, or the holder of a verified token.
#[derive(Debug, Clone)]
pub enum Identity {
    /// No token was presented.
    Anonymous,
    /// A verified token.
    Token(Claims),
}

impl Auth {
    /// Authentication as `config` describes it, with its key files read; `None` when no key is
    /// configured (authentication off: exactly the behaviour without this module).
    pub fn from_config(config: &Config) -> Result<Option<Auth>, AuthConfigError> {
        let configured = config.auth_algorithm.as_deref().map(|a| {
            Algorithm::parse(a).ok_or_else(|| {
                AuthConfigError::Invalid(format!("auth_algorithm {a:?}: use HS256, RS256 or ES256"))
            })
        });
        let configured = configured.transpose()?;
        let sources = [
            config.auth_secret.is_some(),
            config.auth_public_key.is_some(),
            config.auth_jwks.is_some(),
        ];
        let (algorithm, keys) = match sources {
            [false, false, false] => {
                if config.auth_previous_secret.is_some() || configured.is_some() {
                    return Err(AuthConfigError::Invalid(
                        "auth_previous_secret and auth_algorithm need auth_secret, auth_public_key or auth_jwks".into(),
                    ));
                }
                if let Some(name) = policy_without_key(config) {
                    return Err(AuthConfigError::Invalid(format!(
                        "{name} is set, but authentication is off: it needs a key to check \
                         tokens with (auth_secret, auth_public_key or auth_jwks). Without one \
                         every topic is open to anyone; set a key, or remove {name}"
                    )));
                }
                return Ok(None);
            }
            [true, false, false] => {
                let mut secrets = vec![config.auth_secret.clone().unwrap_or_default().into_bytes()];
                if let Some(prev) = &config.auth_previous_secret {
                    secrets.push(prev.clone().into_bytes());
                }
                if secrets.iter().any(Vec::is_empty) {
                    return Err(AuthConfigError::Invalid(
                        "auth secrets may not be empty".into(),
                    ));
                }
                (Algorithm::Hs256, Keys::Secrets(secrets))
            }
            [false, true, false] => {
                let path = config.auth_public_key.as_deref().unwrap_or(Path::new(""));
                let text = read(path)?;
                let key = parse_pem_public_key(&String::from_utf8_lossy(&text))
                    .map_err(|source| key_error(path, source))?;
                (
                    key.algorithm(),
                    Keys::Public(vec![NamedKey { kid: None, key }]),
                )
            }
            [false, false, true] => {
                let path = config.auth_jwks.as_deref().unwrap_or(Path::new(""));
                let Some(alg) = configured.filter(|a| *a != Algorithm::Hs256) else {
                    return Err(AuthConfigError::Invalid(
                        "auth_jwks needs auth_algorithm RS256 or ES256".into(),
                    ));
                };
                let keys =
                    parse_jwks(&read(path)?, alg).map_err(|source| key_error(path, source))?;
                (alg, Keys::Public(keys))
            }
            _ => {
                return Err(AuthConfigError::Invalid(
                    "set only one of auth_secret, auth_public_key and auth_jwks".into(),
                ))
            }
        };
        if let Some(want) = configured {
            if want != algorithm {
                return Err(AuthConfigError::Invalid(format!(
                    "auth_algorithm is {want}, but the configured key is for {algorithm}"
                )));
            }
        }
        if config.auth_previous_secret.is_some() && algorithm != Algorithm::Hs256 {
            return Err(AuthConfigError::Invalid(
                "auth_previous_secret goes with auth_secret".into(),
            ));
        }
        let public = config
            .auth_public_topics
            .iter()
            .map(|p| {
                Pattern::parse(p)
                    .map_err(|e| AuthConfigError::Invalid(format!("auth_public_topics {p:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Auth {
            verifier: Verifier {
                algorithm,
                keys,
                audience: config.auth_audience.clone(),
                issuer: config.auth_issuer.clone(),
                leeway: config.auth_leeway,
            },
            public,
            anonymous: config.auth_anonymous,
            query_token: config.auth_query_token,
            cookie: Some(config.auth_cookie.clone()).filter(|c| !c.is_empty()),
            allowed_origins: config.allowed_origins.clone(),
            warning: config.auth_expiry_warning,
            max_info: config.presence_max_info,
        }))
    }

    /// The token a request carries: `Authorization: Bearer`, else the cookie, else (when
    /// allowed) the `token` query parameter. The cookie from a page of a site not allowed
    /// ([`Auth::cookie_refusal`]) is refused, not skipped: the page meant it to count.
    pub fn token_of<'h>(&self, head: &RequestHead<'h>) -> Result<Option<Cow<'h, str>>, Refusal> {
        if let Some(Ok(Credentials::Bearer(t))) =
            head.header_str("authorization").map(parse_authorization)
        {
            return Ok(Some(Cow::Borrowed(t)));
        }
        if let Some(name) = &self.cookie {
            let found = head
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
                .filter_map(|(_, v)| std::str::from_utf8(v).ok())
                .find_map(|v| cookie_value(v, name));
            if let Some(t) = found {
                if let Some(refusal) = self.cookie_refusal(head) {
                    return Err(refusal);
                }
                return Ok(Some(Cow::Borrowed(t)));
            }
        }
        if self.query_token {
            for (k, v) in http1::query_pairs(head.query()).flatten() {
                if k == "token" {
                    return Ok(Some(v));
                }
            }
        }
        Ok(None)
    }

    /// Why the cookie of a request may not count, if it may not. With an `Origin`, the origin
    /// decides: the server's own (the `Origin`'s host and port are the request's `Host`) or
    /// one of `allowed_origins`; `Origin: null` (a sandboxed page, a file) is never the
    /// server's own. Without one, the request must not say another page made it: for a
    /// subresource (`<img>`, `<script>`, a no-cors `fetch`) of a sibling subdomain a browser
    /// sends `Sec-Fetch-Site: same-site` and no `Origin`, and `SameSite` cookies go along. So
    /// only `same-origin`, `none` (the user typed the address) or no `Sec-Fetch-Site` (not a
    /// browser, or one too old to send it) pass, as on the API (`api::access::browser_check`).
    fn cookie_refusal(&self, head: &RequestHead<'_>) -> Option<Refusal> {
        let Some(origin) = head.header_str("origin") else {
            let site = head.header_str("sec-fetch-site").map(str::trim);
            return match site {
                None | Some("same-origin" | "none") => None,
                Some(_) => Some(Refusal::FOREIGN_SITE),
            };
        };
        let allowed = |o: &String| o == "*" || o.eq_ignore_ascii_case(origin.trim());
        if self.allowed_origins.iter().any(allowed) {
            return None;
        }
        let authority = origin.trim().split_once("://").map(|(_, a)| a);
        let own = match (authority, head.header_str("host")) {
            (Some(a), Some(host)) => !a.is_empty() && a.eq_ignore_ascii_case(host.trim()),
            _ => false,
        };
        (!own).then_some(Refusal::FOREIGN_ORIGIN)
    }

    /// Verifies `token` at `now` (seconds since the Unix epoch).
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, Refusal> {
        let claims = self
            .verifier
            .verify(token.as_bytes(), now)
            .map_err(Refusal::token)?;
        if claims
            .info
            .as_ref()
            .is_some_and(|i| i.len() > self.max_info)
        {
            return Err(Refusal::INFO_TOO_LARGE);
        }
        Ok(claims)
    }

    /// Who sent `head`: anonymous, or the holder of a valid token. A token that does not
    /// verify is refused even where anonymous access would do: a client that sent one expects
    /// it to count.
    pub fn identify(&self, head: &RequestHead<'_>, now: u64) -> Result<Identity, Refusal> {
        match self.token_of(head)? {
            None if self.anonymous => Ok(Identity::Anonymous),
            None => Err(Refusal::MISSING),
            Some(t) => self.verify(&t, now).map(Identity::Token),
        }
    }

    /// Whether a connection holding `grants` (`None`: no token) may subscribe to `topic`.
    pub fn may_subscribe(&self, grants: Option<&Grants>, topic: &str) -> Result<(), Refusal> {
        match grants {
            Some(g) if g.may_subscribe(topic) => Ok(()),
            Some(_) if clarion_proto::auth::pattern::any_matches(&self.public, topic) => Ok(()),
            None if self.anonymous
                && clarion_proto::auth::pattern::any_matches(&self.public, topic) =>
            {
                Ok(())
            }
            Some(_) => Err(Refusal::FORBIDDEN),
            None => Err(Refusal::MISSING),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, AuthConfigError> {
    std::fs::read(path).map_err(|source| AuthConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn key_error(path: &Path, source: KeyError) -> AuthConfigError {
    AuthConfigError::Key {
        path: path.display().to_string(),
        source,
    }
}

/// The current Unix time in seconds (the shell's clock; the engine is given it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
