//! Verification against tokens made by PyJWT (`testdata/auth_vectors.json`: an RSA and a P-256
//! key, and tokens signed with them and with two HS256 secrets), and against tokens forged here.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::*;

const NOW: u64 = 1_800_000_000;

fn vectors() -> serde_json::Value {
    serde_json::from_str(include_str!("../../testdata/auth_vectors.json")).unwrap()
}

fn s(v: &serde_json::Value, k: &str) -> String {
    v[k].as_str().unwrap().to_owned()
}

fn hs() -> Verifier {
    Verifier {
        algorithm: Algorithm::Hs256,
        keys: Keys::Secrets(vec![
            b"current-secret".to_vec(),
            b"previous-secret".to_vec(),
        ]),
        audience: Some("app".into()),
        issuer: Some("backend".into()),
        leeway: 0,
    }
}

fn public(alg: Algorithm, pem: &str) -> Verifier {
    Verifier {
        algorithm: alg,
        keys: Keys::Public(vec![NamedKey {
            kid: None,
            key: parse_pem_public_key(pem).unwrap(),
        }]),
        audience: None,
        issuer: None,
        leeway: 0,
    }
}

/// A token with `header` and `claims`, signed with HS256 under `secret`.
fn hs_token(header: &str, claims: &str, secret: &[u8]) -> String {
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

#[test]
fn every_algorithm_verifies_pyjwt_tokens() {
    let v = vectors();
    let c = hs().verify(s(&v, "hs").as_bytes(), NOW).unwrap();
    assert_eq!(c.sub.as_deref(), Some("alice"));
    assert_eq!(c.exp, 4_102_444_800);
    assert!(c.grants.may_subscribe("chat.x") && c.grants.may_subscribe("news"));
    assert!(!c.grants.may_subscribe("chat") && !c.grants.may_publish("news"));
    // The previous secret is still accepted during a rotation.
    assert!(hs().verify(s(&v, "hs_old").as_bytes(), NOW).is_ok());
    let rs = public(Algorithm::Rs256, &s(&v, "rsa_pem"));
    assert_eq!(
        rs.verify(s(&v, "rs").as_bytes(), NOW)
            .unwrap()
            .sub
            .as_deref(),
        Some("alice")
    );
    let es = public(Algorithm::Es256, &s(&v, "ec_pem"));
    assert!(es.verify(s(&v, "es").as_bytes(), NOW).is_ok());
}

#[test]
fn jwks_keys_are_chosen_by_kid() {
    let v = vectors();
    let mut jwk = v["ec_jwk"].clone();
    jwk["kid"] = "k1".into();
    let mut other = jwk.clone();
    other["kid"] = "k2".into();
    let set = serde_json::json!({ "keys": [other, jwk] }).to_string();
    let keys = parse_jwks(set.as_bytes(), Algorithm::Es256).unwrap();
    assert_eq!(keys[1].key, parse_pem_public_key(&s(&v, "ec_pem")).unwrap());
    let mut ver = public(Algorithm::Es256, &s(&v, "ec_pem"));
    ver.keys = Keys::Public(keys.clone());
    assert!(ver.verify(s(&v, "es").as_bytes(), NOW).is_ok());
    // Only a key named k2: the token's k1 is unknown.
    ver.keys = Keys::Public(vec![keys[0].clone()]);
    assert_eq!(
        ver.verify(s(&v, "es").as_bytes(), NOW),
        Err(TokenError::UnknownKey)
    );
    let rsa = serde_json::json!({ "keys": [v["rsa_jwk"]] }).to_string();
    let keys = parse_jwks(rsa.as_bytes(), Algorithm::Rs256).unwrap();
    assert_eq!(
        keys[0].key,
        parse_pem_public_key(&s(&v, "rsa_pem")).unwrap()
    );
}

#[test]
fn wrong_key_and_tampering_are_refused() {
    let v = vectors();
    let mut wrong = hs();
    wrong.keys = Keys::Secrets(vec![b"other".to_vec()]);
    assert_eq!(
        wrong.verify(s(&v, "hs").as_bytes(), NOW),
        Err(TokenError::Signature)
    );
    // An EC token checked with an RSA verifier names the wrong algorithm.
    let rs = public(Algorithm::Rs256, &s(&v, "rsa_pem"));
    assert_eq!(
        rs.verify(s(&v, "es").as_bytes(), NOW),
        Err(TokenError::Algorithm)
    );
    // Claims changed after signing: the payload says bob.
    let tok = s(&v, "rs");
    let parts: Vec<&str> = tok.split('.').collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = "bob".into();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        parts[2]
    );
    assert_eq!(
        rs.verify(forged.as_bytes(), NOW),
        Err(TokenError::Signature)
    );
    // A flipped signature byte.
    let mut sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    sig[10] ^= 1;
    let flipped = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(sig));
    assert_eq!(
        rs.verify(flipped.as_bytes(), NOW),
        Err(TokenError::Signature)
    );
}

#[test]
fn none_and_algorithm_confusion_are_refused() {
    let v = vectors();
    let claims = r#"{"exp":4102444800}"#;
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
        URL_SAFE_NO_PAD.encode(claims)
    );
    assert_eq!(
        hs().verify(none.as_bytes(), NOW),
        Err(TokenError::Algorithm)
    );
    // HS256 with the RSA public key's PEM as the secret: the classic confusion attack.
    let pem = s(&v, "rsa_pem");
    let confused = hs_token(HEADER, claims, pem.as_bytes());
    let rs = public(Algorithm::Rs256, &pem);
    assert_eq!(
        rs.verify(confused.as_bytes(), NOW),
        Err(TokenError::Algorithm)
    );
    let lower = hs_token(r#"{"alg":"hs256"}"#, claims, b"current-secret");
    assert_eq!(
        hs().verify(lower.as_bytes(), NOW),
        Err(TokenError::Algorithm)
    );
}

#[test]
fn time_claims_are_checked_against_now() {
    let mut ver = hs();
    ver.audience = None;
    ver.issuer = None;
    let t = |claims: &str| hs_token(HEADER, claims, b"current-secret");
    assert_eq!(
        ver.verify(t(r#"{"sub":"a"}"#).as_bytes(), NOW),
        Err(TokenError::MissingExpiry)
    );
    let exp = format!(r#"{{"exp":{NOW}}}"#);
    assert_eq!(
        ver.verify(t(&exp).as_bytes(), NOW),
        Err(TokenError::Expired)
    );
    assert!(ver.verify(t(&exp).as_bytes(), NOW - 1).is_ok());
    let nbf = format!(r#"{{"exp":{},"nbf":{}}}"#, NOW + 100, NOW + 10);
    assert_eq!(
        ver.verify(t(&nbf).as_bytes(), NOW),
        Err(TokenError::NotYetValid)
    );
    assert!(ver.verify(t(&nbf).as_bytes(), NOW + 10).is_ok());
    let iat = format!(r#"{{"exp":{},"iat":{}}}"#, NOW + 100, NOW + 10);
    assert_eq!(
        ver.verify(t(&iat).as_bytes(), NOW),
        Err(TokenError::NotYetValid)
    );
    ver.leeway = 10;
    assert!(ver.verify(t(&iat).as_bytes(), NOW).is_ok());
    assert!(ver.verify(t(&exp).as_bytes(), NOW + 9).is_ok());
    let frac = format!(r#"{{"exp":{}.5}}"#, NOW + 1);
    assert_eq!(ver.verify(t(&frac).as_bytes(), NOW).unwrap().exp, NOW + 1);
    let neg = r#"{"exp":-5}"#;
    assert!(matches!(
        ver.verify(t(neg).as_bytes(), NOW),
        Err(TokenError::Claims(_))
    ));
}

#[test]
fn audience_and_issuer_are_checked_when_configured() {
    let t = |claims: &str| hs_token(HEADER, claims, b"current-secret");
    let ok = t(r#"{"exp":4102444800,"aud":["x","app"],"iss":"backend"}"#);
    assert!(hs().verify(ok.as_bytes(), NOW).is_ok());
    let aud = t(r#"{"exp":4102444800,"aud":"other","iss":"backend"}"#);
    assert_eq!(hs().verify(aud.as_bytes(), NOW), Err(TokenError::Audience));
    let no_aud = t(r#"{"exp":4102444800,"iss":"backend"}"#);
    assert_eq!(
        hs().verify(no_aud.as_bytes(), NOW),
        Err(TokenError::Audience)
    );
    let iss = t(r#"{"exp":4102444800,"aud":"app","iss":"evil"}"#);
    assert_eq!(hs().verify(iss.as_bytes(), NOW), Err(TokenError::Issuer));
}

#[test]
fn malformed_tokens_and_bad_grants_are_refused() {
    let ver = hs();
    for bad in ["", "a", "a.b", "a.b.c.d", "!!.e30.e30", "e30.e30.e30"] {
        let e = ver.verify(bad.as_bytes(), NOW).unwrap_err();
        assert!(
            matches!(e, TokenError::Malformed | TokenError::Algorithm),
            "{bad}: {e:?}"
        );
    }
    assert_eq!(
        ver.verify(&[b'a'; MAX_TOKEN_LEN + 1], NOW),
        Err(TokenError::TooLong)
    );
    assert_eq!(
        ver.verify(&[0xff, b'.', b'.'], NOW),
        Err(TokenError::Malformed)
    );
    for header in [
        r#"{"alg":"HS256","crit":["x"]}"#,
        r#"{"alg":"HS256","crit":null}"#,
        r#"{"alg":"HS256","crit":[]}"#,
    ] {
        let crit = hs_token(header, r#"{"exp":4102444800}"#, b"current-secret");
        assert_eq!(
            ver.verify(crit.as_bytes(), NOW),
            Err(TokenError::Malformed),
            "{header}"
        );
    }
    let mut open = hs();
    open.audience = None;
    open.issuer = None;
    let bad = hs_token(
        HEADER,
        r#"{"exp":4102444800,"clarion":{"subscribe":["a*b"]}}"#,
        b"current-secret",
    );
    assert!(matches!(
        open.verify(bad.as_bytes(), NOW),
        Err(TokenError::Claims(_))
    ));
    let many: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    let claims =
        serde_json::json!({"exp": 4102444800u64, "clarion": {"publish": many}}).to_string();
    let big = hs_token(HEADER, &claims, b"current-secret");
    assert!(matches!(
        open.verify(big.as_bytes(), NOW),
        Err(TokenError::Claims(_))
    ));
    let typed = hs_token(HEADER, r#"{"exp":"soon"}"#, b"current-secret");
    assert_eq!(
        open.verify(typed.as_bytes(), NOW),
        Err(TokenError::Malformed)
    );
}

#[test]
fn cookies_are_found_by_name() {
    assert_eq!(
        cookie_value("a=1; clarion_token=xyz; b=2", "clarion_token"),
        Some("xyz")
    );
    assert_eq!(
        cookie_value("clarion_token=\"q\"", "clarion_token"),
        Some("q")
    );
    assert_eq!(cookie_value("xclarion_token=1", "clarion_token"), None);
    assert_eq!(cookie_value("", "clarion_token"), None);
}
