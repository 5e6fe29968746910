//! A complete answer on the API listener (publishing, health, metrics, the dashboard): status,
//! content type, extra headers and body, written whole with proto's head writer. The API and the
//! dashboard answer through this one type, so every answer there is framed the same way.
//!
//! It knows nothing of routes or credentials; those are [`crate::api`]'s and
//! [`crate::dashboard`]'s.

use std::io::{self, Write};

use clarion_proto::http1;

/// A complete answer.
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// Headers beyond `Content-Type`, `Content-Length` and `Connection`.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The body, sent with its `Content-Length`.
    pub body: Vec<u8>,
}

impl Answer {
    /// An answer with no extra headers.
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Answer {
        Answer {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A JSON answer: `value` and a newline.
    pub fn json(status: u16, value: &serde_json::Value) -> Answer {
        let mut body = value.to_string().into_bytes();
        body.push(b'\n');
        Answer::new(status, "application/json", body)
    }

    /// A JSON error: `{"error": why}`.
    pub fn error(status: u16, why: &str) -> Answer {
        Answer::json(status, &serde_json::json!({ "error": why }))
    }

    /// The same answer with one more header.
    pub fn with_header(mut self, name: &'static str, value: &'static str) -> Answer {
        self.headers.push((name, value));
        self
    }

    /// The whole HTTP/1.1 response; `keep` false adds `Connection: close`.
    pub fn bytes(&self, keep: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.body.len());
        let mut headers = vec![("Content-Type", self.content_type)];
        headers.extend_from_slice(&self.headers);
        if !keep {
            headers.push(("Connection", "close"));
        }
        http1::write_response_head(&mut out, self.status, &headers, Some(self.body.len()));
        out.extend_from_slice(&self.body);
        out
    }

    /// Writes the whole response.
    pub fn send(&self, stream: &mut impl Write, keep: bool) -> io::Result<()> {
        stream.write_all(&self.bytes(keep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_framed_whole() {
        let a = Answer::error(503, "busy").with_header("Retry-After", "5");
        let text = String::from_utf8(a.bytes(false)).unwrap_or_default();
        assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
        for line in [
            "Content-Type: application/json\r\n",
            "Retry-After: 5\r\n",
            "Connection: close\r\n",
            "Content-Length: 17\r\n",
        ] {
            assert!(text.contains(line), "{line:?} missing in {text:?}");
        }
        assert!(text.ends_with("\r\n\r\n{\"error\":\"busy\"}\n"), "{text}");
        let kept = String::from_utf8(Answer::new(200, "text/plain", "ok\n").bytes(true));
        assert!(!kept.unwrap_or_default().contains("Connection:"));
    }
}
