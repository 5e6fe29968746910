//! Who may ask the API what: the API key and tokens (publishing, the dashboard, `/metrics`),
//! the browser checks against CSRF and DNS rebinding, and which requests a connection past the
//! pool's caps may still make (docs/security.md).

use clarion_proto::http1::authorization::{
    constant_time_eq, parse_authorization, AuthorizationError, Credentials,
};

use super::request::Request;
use crate::reply::Answer;
use crate::worker::Shared;

/// What a browser must not do on the API (docs/security.md): reach it under a name that is not
/// the API's (DNS rebinding: `421`), or make a state-changing request from another site's page
/// (CSRF: `403`), whatever credentials it carries along (a cached dashboard login, say).
/// Requests not from a browser carry no `Origin` or `Sec-Fetch-Site` and pass.
pub(super) fn browser_check(
    req: &Request,
    shared: &Shared,
    local: Option<std::net::SocketAddr>,
) -> Option<Answer> {
    let host = req.host.as_deref().map(str::trim).unwrap_or_default();
    let name = host_name(host);
    let allowed: &[String] = &shared.config.api_hosts;
    let loopback_api = local.is_some_and(|a| a.ip().is_loopback());
    let listed = allowed.iter().any(|h| h.eq_ignore_ascii_case(name));
    // A browser always sends `Host`; a request without one (HTTP/1.0 probes) is no rebinding.
    let known = name.is_empty()
        || listed
        || (allowed.is_empty() && !loopback_api)
        || is_loopback_name(name);
    if !known {
        return Some(Answer::error(
            421,
            &format!("this API does not answer to {name:?} (api_hosts)"),
        ));
    }
    if req.method == "GET" || req.method == "HEAD" {
        return None;
    }
    let origins = &shared.config.allowed_origins;
    let origin_ok = |o: &str| {
        let o = o.trim();
        origins
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(o))
            || o.split_once("://")
                .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
    };
    let foreign_site = req
        .fetch_site
        .as_deref()
        .is_some_and(|s| !matches!(s.trim(), "same-origin" | "none"));
    let foreign_origin = req.origin.as_deref().is_some_and(|o| !origin_ok(o));
    let allowed_anyway = req.origin.as_deref().is_some_and(origin_ok);
    if foreign_origin || (foreign_site && !allowed_anyway) {
        shared.metrics.auth_failed("origin");
        return Some(Answer::error(
            403,
            "a page of another origin may not publish here (allowed_origins)",
        ));
    }
    None
}

/// The name part of a `Host` value: `[::1]` of `[::1]:8081`, `localhost` of `localhost:8081`.
pub(super) fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(host, |(n, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            n
        } else {
            host
        }
    })
}

/// `localhost`, `*.localhost`, `127.x.y.z`, `[::1]`: names that can only mean this machine.
pub(super) fn is_loopback_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "localhost"
        || lower.ends_with(".localhost")
        || lower == "[::1]"
        || lower
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request on a reserve connection is served: a caller with the API key or a valid
/// token. An open API (neither configured) has no credentials to tell its publishers from
/// anyone else: past its caps only `/healthz` is answered (by the triage, from the head).
pub(super) fn credentialed(req: &Request, shared: &Shared) -> bool {
    let header = req.authorization.as_deref();
    let key = shared.config.api_key.as_deref();
    if key.is_some_and(|k| authorized(header, k)) {
        return true;
    }
    shared.auth.as_ref().is_some_and(|auth| {
        token_of(header).is_some_and(|t| auth.verify(&t, crate::auth::unix_now()).is_ok())
    })
}

/// What a publish request may publish to.
pub(super) enum Permit {
    /// Any topic: the API key, or no authentication configured.
    All,
    /// The topics a client token's `publish` list covers.
    Token(clarion_proto::auth::Grants),
}

impl Permit {
    /// `Ok` when `topic` may be published to, else the `403` answer.
    pub(super) fn check(&self, topic: &str, shared: &Shared) -> Result<(), Answer> {
        match self {
            Permit::All => Ok(()),
            Permit::Token(g) if g.may_publish(topic) => Ok(()),
            Permit::Token(_) => {
                shared.metrics.auth_failed("forbidden");
                Err(Answer::error(
                    403,
                    &format!("the token does not allow publishing to {topic:?}"),
                ))
            }
        }
    }
}

/// Whether the caller may read what a subscriber of `topic` reads (its presence, its latest
/// message): the API key, an admin token, or a token (or public topic) that grants the topic;
/// without authentication, as the rest of the API (the API key when one is set). `Err` is the
/// answer (`401`, `403`), counted.
pub(super) fn may_subscribe(req: &Request, topic: &str, shared: &Shared) -> Result<(), Answer> {
    let header = req.authorization.as_deref();
    let key = shared.config.api_key.as_deref();
    if key.is_some_and(|key| authorized(header, key)) {
        return Ok(());
    }
    let Some(auth) = shared.auth.as_ref() else {
        return match key {
            Some(_) => Err(refused(header, None, shared)),
            None => Ok(()),
        };
    };
    let grants = match token_of(header).map(|t| auth.verify(&t, crate::auth::unix_now())) {
        Some(Ok(claims)) if claims.admin => return Ok(()),
        Some(Ok(claims)) => Some(claims.grants),
        Some(Err(r)) => {
            r.count(&shared.metrics);
            return Err(refused(header, Some(r), shared));
        }
        None => None,
    };
    if let Err(r) = auth.may_subscribe(grants.as_ref(), topic) {
        r.count(&shared.metrics);
        if r.status != 403 {
            // No credentials: say which ones this API takes.
            return Err(refused(header, Some(r), shared));
        }
        return Err(Answer::error(
            r.status,
            "the token does not grant this topic",
        ));
    }
    Ok(())
}

/// With authentication configured, a publish request needs the API key (when one is set), a
/// token with the `admin` claim (any topic), or a token whose `publish` list will be checked
/// against each topic (as `Bearer`, or as the password of `Basic` credentials); `401` otherwise.
/// Without authentication, everything is as before (`precheck` checks the API key).
pub(super) fn permit(req: &Request, shared: &Shared) -> Result<Permit, Answer> {
    let publish = req.path == "/publish" || req.path.starts_with("/publish/");
    let Some(auth) = shared.auth.as_ref().filter(|_| publish) else {
        return Ok(Permit::All);
    };
    let header = req.authorization.as_deref();
    if let Some(key) = shared.config.api_key.as_deref() {
        if authorized(header, key) {
            return Ok(Permit::All);
        }
    }
    let refusal = match token_of(header) {
        Some(token) => match auth.verify(&token, crate::auth::unix_now()) {
            Ok(claims) if claims.admin => return Ok(Permit::All),
            Ok(claims) => return Ok(Permit::Token(claims.grants)),
            Err(r) => r,
        },
        None => crate::auth::Refusal::MISSING,
    };
    refusal.count(&shared.metrics);
    Err(refused(header, Some(refusal), shared))
}

/// The `401` for credentials the API did not accept: what was wrong, and which credential it
/// expected (names of settings and algorithms, nothing secret). `refusal` is the token's, with
/// authentication configured.
pub(super) fn refused(
    header: Option<&str>,
    refusal: Option<crate::auth::Refusal>,
    shared: &Shared,
) -> Answer {
    use crate::auth::Refusal;
    let what = match refusal {
        None if header.is_none() => "no credentials",
        Some(Refusal::MISSING) => "no credentials",
        // Not even shaped like a JWT: most likely a mistyped or stale API key.
        Some(r) if r.label == "malformed" => "the bearer is neither the API key nor a token",
        None => "wrong API key",
        // A token signed otherwise than configured: the expected signer helps.
        Some(r) if matches!(r.label, "algorithm" | "unknown_key" | "signature") => r.reason,
        // The right kind of credential with a flaw of its own (expired, audience...).
        Some(r) => return Answer::error(401, r.reason),
    };
    Answer::error(401, &format!("{what}: expected {}", expected(shared)))
}

/// Which credentials this API accepts, in words.
fn expected(shared: &Shared) -> String {
    let c = &shared.config;
    let key = "the API key (api_key) as `Authorization: Bearer KEY`";
    let Some(auth) = shared.auth.as_ref() else {
        return key.to_owned();
    };
    let signer = if c.auth_secret.is_some() {
        "auth_secret"
    } else if c.auth_jwks.is_some() {
        "a key of auth_jwks"
    } else {
        "the private half of auth_public_key"
    };
    let token = format!(
        "a token (a JWT signed {} with {signer}) as `Authorization: Bearer TOKEN`",
        auth.verifier.algorithm
    );
    if c.api_key.is_some() {
        format!("{key}, or {token}")
    } else {
        // Tokens were turned on for the clients; backends may not know they now need one.
        format!(
            "{token}; no api_key is set: set one for backends (api_key), or make a token that \
             publishes anywhere with `clarion token --admin`"
        )
    }
}

/// Whether a dashboard request's credentials open it. Without authentication configured, as the
/// rest of the API: the API key when one is set, else anyone. With authentication configured,
/// the API key (when set) or a token whose `clarion` claim has `"admin": true`, sent as `Bearer`
/// or as the password of `Basic` credentials (what a browser's sign-in prompt sends).
pub(super) fn admin_ok(header: Option<&str>, shared: &Shared) -> bool {
    let key = shared.config.api_key.as_deref();
    let Some(auth) = shared.auth.as_ref() else {
        return key.is_none_or(|key| authorized(header, key));
    };
    if key.is_some_and(|key| authorized(header, key)) {
        return true;
    }
    let Some(token) = token_of(header) else {
        return false;
    };
    match auth.verify(&token, crate::auth::unix_now()) {
        Ok(claims) if claims.admin => true,
        Ok(_) => {
            shared.metrics.auth_failed("forbidden");
            false
        }
        Err(refusal) => {
            refusal.count(&shared.metrics);
            false
        }
    }
}

/// The token an `Authorization` header carries: `Bearer TOKEN`, or the password of `Basic`
/// credentials (a browser on the dashboard signs in that way).
pub(super) fn token_of(header: Option<&str>) -> Option<std::borrow::Cow<'_, str>> {
    match header.map(parse_authorization) {
        Some(Ok(Credentials::Bearer(token))) => Some(token.into()),
        Some(Ok(Credentials::Basic { password })) => {
            String::from_utf8(password).ok().map(Into::into)
        }
        _ => None,
    }
}

/// Whether `Authorization` carries the API key: `Bearer KEY`; or, as GRIP publishers send it, a
/// `Bearer` JWT signed with the key (HS256, unexpired), or `Basic` with the key as password.
pub(super) fn authorized(header: Option<&str>, key: &str) -> bool {
    match header.map(parse_authorization) {
        Some(Ok(Credentials::Bearer(token))) => {
            if constant_time_eq(token.as_bytes(), key.as_bytes()) {
                return true;
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            clarion_proto::grip::sig::verify(token, key.as_bytes(), now).is_ok()
        }
        Some(Ok(Credentials::Basic { password })) => constant_time_eq(&password, key.as_bytes()),
        // Malformed Basic credentials have always counted as an empty password (which only an
        // empty key matches).
        Some(Err(AuthorizationError::Base64 | AuthorizationError::NoPassword)) => {
            constant_time_eq(b"", key.as_bytes())
        }
        Some(Err(AuthorizationError::Scheme)) | None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{host_name, is_loopback_name};

    #[test]
    fn host_names_and_loopback_names() {
        assert_eq!(host_name("127.0.0.1:8081"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8081"), "[::1]");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("evil.example:80"), "evil.example");
        for n in [
            "localhost",
            "LOCALHOST",
            "a.localhost",
            "127.0.0.1",
            "127.9.8.7",
            "[::1]",
        ] {
            assert!(is_loopback_name(n), "{n}");
        }
        for n in [
            "evil.example",
            "localhost.evil.example",
            "10.0.0.1",
            "0.0.0.0",
            "",
        ] {
            assert!(!is_loopback_name(n), "{n}");
        }
    }
}
