//! `clarion publish`: a minimal HTTP/1.1 client for the publish API, so a shell script or an
//! operator can publish without curl. Plain `http://` only: the API listens on loopback or a
//! private network by design.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clarion_proto::http1::{self, HeadWriteError, ResponseBody};

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
    let target = format!("{base}/publish/{}", args.topic);
    let length = message.len().to_string();
    let bearer = args.api_key.as_ref().map(|k| format!("Bearer {k}"));
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("Host", authority.as_bytes()),
        ("Content-Type", content_type.as_bytes()),
        ("Content-Length", length.as_bytes()),
        ("Connection", b"close"),
    ];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_bytes()));
    }
    let mut req = Vec::with_capacity(256 + message.len());
    // A topic or key with a space or a line break would change the request's meaning.
    http1::write_request_head(&mut req, "POST", &target, &headers, None).map_err(|e| match e {
        HeadWriteError::Target => anyhow!("topic {:?} cannot be sent in a URL", args.topic),
        e => anyhow!("cannot write the request: {e}"),
    })?;
    req.extend_from_slice(&message);
    stream.write_all(&req)?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("cannot read the answer")?;
    let (status, body) = answer(&response)?;
    println!("{}", String::from_utf8_lossy(&body).trim_end());
    if !(200..300).contains(&status) {
        bail!("publish failed with HTTP {status}");
    }
    Ok(())
}

/// Largest answer head accepted: the API's are a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in an answer.
const MAX_HEADERS: usize = 32;

/// The status and body of a complete answer read until the server closed the connection.
fn answer(response: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let not_http = |why: &dyn std::fmt::Display| {
        let start = String::from_utf8_lossy(response.get(..80).unwrap_or(response)).into_owned();
        anyhow!("not an HTTP answer ({why}): {start:?}")
    };
    let head = http1::parse_response_head(response, MAX_HEADERS, MAX_HEAD)
        .map_err(|e| not_http(&e))?
        .ok_or_else(|| not_http(&"incomplete head"))?;
    let rest = response.get(head.head_len..).unwrap_or_default();
    let body = match head.body("POST").map_err(|e| not_http(&e))? {
        ResponseBody::None => Vec::new(),
        ResponseBody::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            rest.get(..n)
                .ok_or_else(|| anyhow!("the answer's body was cut short"))?
                .to_vec()
        }
        ResponseBody::Chunked => {
            let mut body = Vec::new();
            match http1::ChunkedDecoder::new(usize::MAX).decode(rest, &mut body) {
                Ok((_, true)) => body,
                Ok((_, false)) => bail!("the answer's body was cut short"),
                Err(e) => bail!("the answer's body is not valid: {e}"),
            }
        }
        ResponseBody::UntilClose => rest.to_vec(),
    };
    Ok((head.status, body))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_answers_by_their_framing() {
        let (status, body) =
            answer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}\n\nextra").unwrap();
        assert_eq!((status, &body[..]), (200, &b"{}\n\n"[..]));
        let (status, body) = answer(
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbad\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((status, &body[..]), (400, &b"bad"[..]));
        let (_, body) = answer(b"HTTP/1.0 200 OK\r\n\r\nall of it").unwrap();
        assert_eq!(body, b"all of it");
        assert!(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort")
            .unwrap_err()
            .to_string()
            .contains("cut short"));
        assert!(answer(b"SSH-2.0-OpenSSH\r\n\r\n")
            .unwrap_err()
            .to_string()
            .contains("not an HTTP answer"));
        assert!(answer(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
