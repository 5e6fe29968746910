//! `clarion publish`: a minimal HTTP/1.1 client for the publish API, so a shell script or an
//! operator can publish without curl. Plain `http://` only: the API listens on loopback or a
//! private network by design.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::cli::PublishArgs;

/// Publishes one message and prints the server's JSON answer. Fails on a non-2xx status.
pub fn run(args: &PublishArgs) -> anyhow::Result<()> {
    let message = match args.message.as_deref() {
        Some(m) if m != "-" => m.as_bytes().to_vec(),
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the message from stdin")?;
            buf
        }
    };
    let rest = args
        .api
        .strip_prefix("http://")
        .with_context(|| format!("--api must be an http:// URL, got {:?}", args.api))?;
    let (authority, base) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let base = base.trim_end_matches('/');
    let mut stream =
        TcpStream::connect(authority).with_context(|| format!("cannot connect to {authority}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let content_type = if args.binary {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut req = format!(
        "POST {base}/publish/{topic} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {len}\r\nConnection: close\r\n",
        topic = args.topic,
        len = message.len()
    );
    if let Some(key) = &args.api_key {
        req.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    stream.write_all(&message)?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("cannot read the answer")?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {head:?}"))?;
    println!("{}", body.trim_end());
    if !(200..300).contains(&status) {
        bail!("publish failed with HTTP {status}");
    }
    Ok(())
}
