//! The dashboard page: one HTML file with its styles and script inline, compiled into the
//! binary, so there is nothing to fetch from elsewhere and nothing to build.

use crate::reply::Answer;

/// The page (`dashboard.html` beside this file).
pub const HTML: &str = include_str!("dashboard.html");

/// What the page may do: its own inline script and styles, requests to its own origin only,
/// and never be framed by another site.
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                      connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                      frame-ancestors 'none'";

/// `GET /dashboard`.
pub fn answer() -> Answer {
    Answer {
        status: 200,
        content_type: "text/html; charset=utf-8",
        headers: vec![
            ("Content-Security-Policy", POLICY),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-cache"),
        ],
        body: HTML.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_small_and_self_contained() {
        assert!(HTML.len() < 40 * 1024, "page is {} bytes", HTML.len());
        for outside in ["http://", "https://", "//cdn", "src=\"/", "@import"] {
            assert!(!HTML.contains(outside), "page refers outside: {outside}");
        }
    }
}
