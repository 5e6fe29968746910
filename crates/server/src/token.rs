//! `clarion token`: a signed token for trying authentication, presence and the clients without
//! writing a minting script (docs/auth.md, "Tokens for trying things"). The key is the one the
//! server verifies with: `auth_secret` from the same flag, `CLARION_*` variable or `--config`
//! file as `clarion serve`, or, for RS256/ES256, the private half of `auth_public_key` given
//! with `--private-key`. Signing is `clarion_proto::auth::sign`; this file reads the key and
//! the clock.

use std::path::Path;

use anyhow::{anyhow, bail, Context as _};
use clarion_proto::auth::sign::{sign, SigningKey, TokenClaims};
use ring::rand::SystemRandom;

use crate::cli::TokenArgs;
use crate::config::Config;

/// Prints one token on standard output.
pub fn run(args: &TokenArgs) -> anyhow::Result<()> {
    println!("{}", make(args, crate::auth::unix_now())?);
    Ok(())
}

/// The token `args` ask for, made at `now` (Unix seconds).
pub fn make(args: &TokenArgs, now: u64) -> anyhow::Result<String> {
    let file = match &args.config {
        Some(path) => Some(Config::from_file(path)?),
        None => None,
    };
    let rng = SystemRandom::new();
    let key = match (&args.private_key, &args.auth_secret) {
        (Some(path), _) => private_key(path, &rng)?,
        (None, Some(secret)) => SigningKey::Secret(secret.clone().into_bytes()),
        (None, None) => match file.as_ref() {
            Some(Config {
                auth_secret: Some(secret),
                ..
            }) => SigningKey::Secret(secret.clone().into_bytes()),
            Some(c) if c.auth_public_key.is_some() || c.auth_jwks.is_some() => bail!(
                "the server verifies tokens with a public key (auth_public_key or auth_jwks): \
                 give its private half with --private-key FILE"
            ),
            Some(_) | None => bail!(
                "no key to sign with: give the server's secret with --auth-secret (or \
                 CLARION_AUTH_SECRET, or --config FILE with auth_secret), or a private key with \
                 --private-key FILE"
            ),
        },
    };
    let ttl = parse_ttl(&args.ttl)?;
    let info = match &args.info {
        Some(text) => {
            Some(serde_json::from_str(text).map_err(|e| anyhow!("--info is not JSON: {e}"))?)
        }
        None => None,
    };
    let from_file =
        |pick: fn(&Config) -> &Option<String>| file.as_ref().and_then(|c| pick(c).clone());
    let claims = TokenClaims {
        sub: args.sub.clone(),
        iat: now,
        exp: now.saturating_add(ttl),
        aud: args
            .audience
            .clone()
            .or_else(|| from_file(|c| &c.auth_audience)),
        iss: args
            .issuer
            .clone()
            .or_else(|| from_file(|c| &c.auth_issuer)),
        subscribe: args.subscribe.clone(),
        publish: args.publish.clone(),
        admin: args.admin,
        info,
    };
    sign(&key, args.kid.as_deref(), &claims, &rng).map_err(|e| anyhow!("{e}"))
}

fn private_key(path: &Path, rng: &SystemRandom) -> anyhow::Result<SigningKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--private-key {}", path.display()))?;
    SigningKey::from_pem(&text, rng).map_err(|e| anyhow!("--private-key {}: {e}", path.display()))
}

/// `90`, `90s`, `15m`, `1h` or `7d`, in seconds.
fn parse_ttl(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| anyhow!("--ttl {text:?}: expected a number with s, m, h or d (1h)"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => bail!("--ttl {text:?}: the unit is s, m, h or d"),
    };
    match n.checked_mul(scale) {
        Some(0) | None => bail!("--ttl {text:?}: must be at least one second"),
        Some(secs) => Ok(secs),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(line: &[&str]) -> TokenArgs {
        match Cli::try_parse_from([&["clarion", "token"], line].concat())
            .unwrap()
            .command
        {
            Command::Token(t) => t,
            other => panic!("not token: {other:?}"),
        }
    }

    #[test]
    fn ttls_read_as_people_write_them() {
        assert_eq!(parse_ttl("90").unwrap(), 90);
        assert_eq!(parse_ttl("15m").unwrap(), 900);
        assert_eq!(parse_ttl("1h").unwrap(), 3600);
        assert_eq!(parse_ttl("7d").unwrap(), 604_800);
        for bad in ["", "h", "1w", "0s", "-1h", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_token_from_the_secret_is_accepted_by_the_server_s_own_verifier() {
        let a = args(&[
            "--auth-secret",
            "an-hs256-secret-that-is-long-enough-0123",
            "--sub",
            "alice",
            "--subscribe",
            "chat.*",
            "--publish",
            "chat.lobby",
            "--ttl",
            "1h",
            "--info",
            r#"{"name":"Alice"}"#,
        ]);
        let token = make(&a, 1_000_000).unwrap();
        let verifier = clarion_proto::auth::Verifier {
            algorithm: clarion_proto::auth::Algorithm::Hs256,
            keys: clarion_proto::auth::Keys::Secrets(vec![
                b"an-hs256-secret-that-is-long-enough-0123".to_vec(),
            ]),
            audience: None,
            issuer: None,
            leeway: 0,
        };
        let claims = verifier.verify(token.as_bytes(), 1_000_001).unwrap();
        assert_eq!(claims.sub.as_deref(), Some("alice"));
        assert_eq!(claims.exp, 1_003_600);
        assert!(claims.grants.may_subscribe("chat.x"));
        assert!(claims.grants.may_publish("chat.lobby"));
        assert_eq!(claims.info.as_deref(), Some(r#"{"name":"Alice"}"#));
    }

    #[test]
    fn without_a_key_it_says_where_one_comes_from() {
        let e = make(&args(&["--sub", "alice"]), 0).unwrap_err().to_string();
        assert!(
            e.contains("--auth-secret") && e.contains("--private-key"),
            "{e}"
        );
        let e = make(&args(&["--auth-secret", "s", "--info", "{"]), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--info"), "{e}");
    }
}
