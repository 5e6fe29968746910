//! The bench's publisher: one keep-alive HTTP/1.1 connection to the server's publish API,
//! sending JSON batches and reading each answer with proto's response parser. It owns no
//! scheduling: the coordinator ([`crate::run`]) decides when to publish.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clarion_proto::http1::base_url::parse_base_url;
use clarion_proto::http1::{parse_response_head, ResponseBody};

use crate::stats::unix_micros;
use crate::wire::{MAX_HEAD, MAX_HEADERS};

/// Where the publish API is: `--api` as `host:port` or `http://host:port[/prefix]`, the same
/// forms `clarion publish --api` takes (one parser, `clarion_proto::http1::base_url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTarget {
    /// The address connected to (the first one a host name resolves to).
    pub addr: SocketAddr,
    /// `host:port` as given, for the `Host` header.
    pub authority: String,
    /// The path prefix before `/publish` (empty, or `/prefix`).
    pub prefix: String,
    /// An `Authorization` value for publishing (a server with authentication).
    pub authorization: Option<String>,
}

/// Parses `--api`, resolving a host name.
pub fn parse_api(text: &str) -> Result<ApiTarget, String> {
    let url = parse_base_url(text).map_err(|e| e.to_string())?;
    if url.tls {
        // The bench publishes over plain keep-alive connections to keep its timing simple.
        return Err(format!(
            "{text}: the bench publishes over plain HTTP only; give the API's http:// address"
        ));
    }
    let addr = url
        .authority
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", url.authority))?
        .next()
        .ok_or_else(|| format!("{} has no address", url.authority))?;
    Ok(ApiTarget {
        addr,
        authority: url.authority,
        prefix: url.prefix,
        authorization: None,
    })
}

/// A keep-alive HTTP/1.1 connection to the publish API.
pub struct Api {
    stream: TcpStream,
    seq_buf: Vec<u8>,
    /// The request head up to the length (`POST {prefix}/publish ...Content-Length: `).
    head: String,
    /// The path prefix, and the header lines every request carries (`Host`, `Authorization`).
    prefix: String,
    headers: String,
}

impl Api {
    pub fn connect(api: &ApiTarget) -> anyhow::Result<Api> {
        let addr = api.addr;
        let stream =
            TcpStream::connect(addr).with_context(|| format!("cannot reach the API at {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let headers = format!(
            "Host: {}\r\n{}",
            api.authority,
            api.authorization
                .as_deref()
                .map(|a| format!("Authorization: {a}\r\n"))
                .unwrap_or_default()
        );
        Ok(Api {
            stream,
            seq_buf: Vec::new(),
            head: format!(
                "POST {}/publish HTTP/1.1\r\n{headers}Content-Type: application/json\r\n\
                 Content-Length: ",
                api.prefix
            ),
            prefix: api.prefix.clone(),
            headers,
        })
    }

    /// How long to wait for an answer (30 s unless set).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))
    }

    /// Publishes message `seq` (padded to `size` bytes) to every topic of `topics`.
    pub fn publish_batch(
        &mut self,
        topics: &[String],
        seq: u64,
        size: usize,
    ) -> anyhow::Result<()> {
        let ts = unix_micros();
        let mut data = format!("{seq} {ts} ");
        while data.len() < size {
            data.push('x');
        }
        let messages: Vec<serde_json::Value> = topics
            .iter()
            .map(|t| serde_json::json!({ "topic": t, "data": data }))
            .collect();
        let body = serde_json::json!({ "messages": messages }).to_string();
        self.post(&body)
    }

    /// Sends one `POST /publish` with this JSON body and waits for its `200`.
    pub fn post(&mut self, body: &str) -> anyhow::Result<()> {
        self.post_batch(body).map(|_| ())
    }

    /// [`Api::post`], answering the body (the batch's results).
    pub fn post_batch(&mut self, body: &str) -> anyhow::Result<&[u8]> {
        let head = format!("{}{}\r\n\r\n", self.head, body.len());
        self.exchange(head.as_bytes(), body.as_bytes())
    }

    /// Sends `POST {prefix}{path}` (a path and query, such as `/publish/t?stream=open`) with a
    /// `text/plain` body and waits for its `200`; answers its body.
    pub fn post_text(&mut self, path: &str, body: &str) -> anyhow::Result<&[u8]> {
        let head = format!(
            "POST {}{path} HTTP/1.1\r\n{}Content-Type: text/plain; charset=utf-8\r\n\
             Content-Length: {}\r\n\r\n",
            self.prefix,
            self.headers,
            body.len()
        );
        self.exchange(head.as_bytes(), body.as_bytes())
    }

    /// Writes a request and reads its answer: its body, when the status is `200`.
    fn exchange(&mut self, head: &[u8], body: &[u8]) -> anyhow::Result<&[u8]> {
        self.stream.write_all(head)?;
        self.stream.write_all(body)?;
        // Read one response: head, then Content-Length bytes.
        self.seq_buf.clear();
        let mut chunk = [0u8; 4096];
        let (head_end, len) = loop {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                bail!("the API closed the connection");
            }
            self.seq_buf
                .extend_from_slice(chunk.get(..n).unwrap_or_default());
            let head = parse_response_head(&self.seq_buf, MAX_HEADERS, MAX_HEAD)
                .map_err(|e| anyhow::anyhow!("bad answer from the API: {e}"))?;
            if let Some(h) = head {
                if h.status != 200 {
                    bail!(
                        "publish failed: HTTP/1.{} {} {}",
                        h.minor_version,
                        h.status,
                        h.reason
                    );
                }
                let len = match h.body("POST") {
                    Ok(ResponseBody::Length(n)) => usize::try_from(n)?,
                    Ok(ResponseBody::None) => 0,
                    _ => bail!("the API's answer has no Content-Length"),
                };
                break (h.head_len, len);
            }
        };
        while self.seq_buf.len() < head_end + len {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                bail!("the API closed the connection");
            }
            self.seq_buf
                .extend_from_slice(chunk.get(..n).unwrap_or_default());
        }
        Ok(self
            .seq_buf
            .get(head_end..head_end + len)
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_takes_both_forms() {
        let plain = parse_api("127.0.0.1:8081").expect("host:port");
        assert_eq!(plain.addr, SocketAddr::from(([127, 0, 0, 1], 8081)));
        assert_eq!(
            parse_api("http://127.0.0.1:8081/").ok(),
            Some(plain.clone())
        );
        assert_eq!(parse_api("http://127.0.0.1:8081").ok(), Some(plain));
        let named = parse_api("http://localhost:8081/api/").expect("a name and a prefix");
        assert!(named.addr.ip().is_loopback());
        assert_eq!(
            (named.authority.as_str(), named.prefix.as_str()),
            ("localhost:8081", "/api")
        );
        assert!(parse_api("https://127.0.0.1:8081").is_err());
        assert!(parse_api("8081").is_err());
    }
}
