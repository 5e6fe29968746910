//! `clarion publish`: a minimal HTTP/1.1 client for the publish API, so a shell script or an
//! operator can publish without curl. `http://` by default (the API listens on loopback or a
//! private network by design), `https://` for an API served over TLS ([`link`]).
//!
//! Mistakes are caught before anything is sent where the client can know them (the topic is
//! checked with the server's own rules), and every refusal is shown as the server worded it,
//! with a hint at the option that fixes it. A message the server refuses before reading it
//! (too large, no key) is announced with `Expect: 100-continue`, and if the server closes early
//! anyway, its answer is still read and shown.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

mod link;
use link::{looks_like_tls, Link};

use anyhow::{anyhow, bail, Context as _};
use clarion_proto::http1::base_url::{parse_base_url, BaseUrl};
use clarion_proto::http1::{self, HeadWriteError, ResponseBody};
use clarion_proto::pubsub::{validate_key, validate_topic};

use crate::cli::PublishArgs;

/// Bodies above this many bytes are announced with `Expect: 100-continue`, so a server that
/// refuses them (`413`, `401`) answers before the body is sent. Below it, a round trip costs
/// more than sending the body.
const EXPECT_ABOVE: usize = 64 * 1024;
/// How long to wait for `100 Continue` before sending the body anyway (RFC 9110 §10.1.1: a
/// server may not send it).
const EXPECT_WAIT: Duration = Duration::from_secs(1);
/// How long a silent server is waited for.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// Publishes one message and prints the server's JSON answer. Fails on a non-2xx status.
pub fn run(args: &PublishArgs) -> anyhow::Result<()> {
    // The server's own rule and wording, before anything is read or sent.
    validate_topic(&args.topic).map_err(|e| anyhow!("invalid topic {:?}: {e}", args.topic))?;
    let api = parse_base_url(&args.api).map_err(|e| anyhow!("--api (CLARION_API): {e}"))?;
    // One key for every attempt of this run: a retry of a publish the server took is not
    // delivered twice.
    let key = match &args.idempotency_key {
        Some(k) => {
            validate_key(k).map_err(|e| anyhow!("--idempotency-key: {e}"))?;
            k.clone()
        }
        None => random_key()?,
    };
    let message = match args.message.as_deref() {
        Some(m) if m != "-" => m.as_bytes().to_vec(),
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the message from stdin")?;
            if !args.binary {
                without_final_newline(&mut buf);
            }
            buf
        }
    };
    let content_type = if args.binary {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    };
    let target = format!("{}/publish/{}", api.prefix, escape_path(&args.topic));
    let length = message.len().to_string();
    let bearer = args.api_key.as_ref().map(|k| format!("Bearer {k}"));
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("Host", api.authority.as_bytes()),
        ("Content-Type", content_type.as_bytes()),
        ("Content-Length", length.as_bytes()),
        ("Connection", b"close"),
    ];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_bytes()));
    }
    headers.push(("Idempotency-Key", key.as_bytes()));
    let expect = message.len() > EXPECT_ABOVE;
    if expect {
        headers.push(("Expect", b"100-continue"));
    }
    let mut head = Vec::with_capacity(256);
    // A key with a line break would change the request's meaning.
    http1::write_request_head(&mut head, "POST", &target, &headers, None).map_err(|e| match e {
        HeadWriteError::Target => anyhow!("topic {:?} cannot be sent in a URL", args.topic),
        e => anyhow!("cannot write the request: {e}"),
    })?;
    // A 503 with Retry-After published nothing: send it again after the wait, for at most
    // --retry-for seconds in all.
    let deadline = std::time::Instant::now() + Duration::from_secs(args.retry_for);
    let (status, body) = loop {
        let (status, body, retry_after) = publish_once(&api, args, &head, &message, expect)?;
        match retry_after.filter(|_| status == 503) {
            Some(wait) if std::time::Instant::now() + wait <= deadline => {
                // The server's reason (`{"error": ...}`), else the body as it came.
                let why = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| Some(v.get("error")?.as_str()?.to_owned()))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).trim_end().to_owned());
                eprintln!(
                    "clarion: HTTP 503: {why}; publishing again in {} s",
                    wait.as_secs()
                );
                std::thread::sleep(wait);
            }
            Some(_) | None => break (status, body),
        }
    };
    let text = String::from_utf8_lossy(&body);
    if status == 400 && !api.tls && text.contains("speaks TLS") {
        bail!("{SPEAKS_TLS}");
    }
    println!("{}", text.trim_end());
    if !(200..300).contains(&status) {
        let about_size = text.contains("max_publish_size");
        bail!(
            "publish failed with HTTP {status}{}",
            hint(status, about_size, args)
        );
    }
    Ok(())
}

/// 128 random bits in hex: an `Idempotency-Key` no other publish has.
fn random_key() -> anyhow::Result<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow!("cannot read random bytes for the Idempotency-Key"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// One attempt: connects, sends the request and reads the answer: its status, body and
/// `Retry-After`.
fn publish_once(
    api: &BaseUrl,
    args: &PublishArgs,
    head: &[u8],
    message: &[u8],
    expect: bool,
) -> anyhow::Result<(u16, Vec<u8>, Option<Duration>)> {
    let socket = TcpStream::connect(&api.authority).map_err(|e| {
        anyhow!(
            "cannot connect to the API at {} ({e}): is `clarion serve` running, and is this \
             its API address? Give the server's api_listen (127.0.0.1:8081 by default) with \
             --api or CLARION_API",
            api.authority
        )
    })?;
    let tls = api.tls.then(|| (api.host(), args.cacert.as_deref()));
    let mut stream = Link::new(socket, tls)?;
    let response = exchange(&mut stream, head, message, expect).map_err(|e| {
        let plain_answer = e
            .chain()
            .filter_map(|c| c.downcast_ref::<std::io::Error>())
            .filter_map(|io| io.get_ref()?.downcast_ref::<rustls::Error>())
            .any(|t| matches!(t, rustls::Error::InvalidMessage(_)));
        match (api.tls, &args.cacert) {
            (false, _) => e,
            (true, _) if plain_answer => anyhow!(
                "the API at --api (CLARION_API) answered in plain HTTP, not TLS: give it as \
                 http://HOST:PORT (an API is served over TLS only with serve --tls-api)"
            ),
            (true, None) => anyhow!(
                "{e:#}: is the API listener serving TLS (serve --tls-api)? If its certificate \
                 is signed by a private CA (such as `clarion cert --dev`'s), give that CA with \
                 --cacert (CLARION_CACERT)"
            ),
            (true, Some(ca)) => anyhow!(
                "{e:#}: is the API listener serving TLS (serve --tls-api), and is {} \
                 (--cacert, CLARION_CACERT) the CA that signed its certificate?",
                ca.display()
            ),
        }
    })?;
    if !api.tls && looks_like_tls(&response) {
        bail!("{SPEAKS_TLS}");
    }
    answer(&response)
}

/// What a plain request that met a TLS listener is told.
const SPEAKS_TLS: &str = "the API at --api (CLARION_API) speaks TLS (serve --tls-api): give \
                          it as https://HOST:PORT, with --cacert CA.pem (CLARION_CACERT) when its \
                          certificate is signed by a private CA such as `clarion cert --dev`'s";

/// Sends the request and returns everything the server answered until it closed, without any
/// `100 Continue` interim answer. When the server closes while the body is still being sent
/// (it refused the message from its head), its answer is read all the same.
fn exchange(stream: &mut Link, head: &[u8], body: &[u8], expect: bool) -> anyhow::Result<Vec<u8>> {
    stream.write_all(head).context("cannot send the request")?;
    let mut response = Vec::new();
    let mut send_body = true;
    if expect {
        stream.set_read_timeout(Some(EXPECT_WAIT))?;
        match read_head(stream, &mut response) {
            Ok(Some(100)) => response.clear(),
            // A final answer: the body is not wanted.
            Ok(Some(_)) => send_body = false,
            // Closed without a word: reading on will say so.
            Ok(None) => send_body = false,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(e).context("cannot read the answer"),
        }
    }
    let mut cut_short = None;
    if send_body {
        if let Err(e) = stream.write_all(body) {
            // The server stopped reading (it answers 413 and closes, for one): its answer is
            // what explains why, so read it before reporting the write.
            if !matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) {
                return Err(e).context("cannot send the message");
            }
            cut_short = Some(e);
        }
    }
    stream.set_read_timeout(Some(ANSWER_WAIT))?;
    let mut chunk = [0u8; 8192];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // A reset after the answer arrived ends it as a close would; so does a TLS server
            // that closes without its close_notify.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof
                ) && !response.is_empty() =>
            {
                break
            }
            // A TLS listener waiting for a handshake that never comes: say so, not EAGAIN.
            Err(e)
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
                    && cut_short.is_none() =>
            {
                bail!(
                    "no answer within {} s: is --api (CLARION_API) the server's API listener? \
                     An API served over TLS (serve --tls-api) is given as https://HOST:PORT",
                    ANSWER_WAIT.as_secs()
                )
            }
            Err(e) => {
                return Err(match cut_short {
                    Some(w) => anyhow!(
                        "the server closed the connection while the message ({} bytes) was \
                         being sent ({w}), without an answer",
                        body.len()
                    ),
                    None => anyhow!(e).context("cannot read the answer"),
                })
            }
        }
    }
    if response.is_empty() {
        if let Some(w) = cut_short {
            bail!(
                "the server closed the connection while the message ({} bytes) was being sent \
                 ({w}), without an answer",
                body.len()
            );
        }
    }
    Ok(response)
}

/// Reads until a complete answer head is in `buf`; its status, or `None` when the server
/// closed first.
fn read_head(stream: &mut Link, buf: &mut Vec<u8>) -> std::io::Result<Option<u16>> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some(h)) = http1::parse_response_head(buf, MAX_HEADERS, MAX_HEAD) {
            return Ok(Some(h.status));
        }
        if buf.len() > MAX_HEAD {
            // Not an HTTP head: leave it to `answer` to say so.
            return Ok(Some(0));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// What to try after a refusal, by status (`about_size`: the answer names max_publish_size, so
/// it came from the API and not from another listener).
fn hint(status: u16, about_size: bool, args: &PublishArgs) -> &'static str {
    match status {
        401 if args.api_key.is_none() => {
            ": the server requires a key; give it with --api-key or CLARION_API_KEY"
        }
        401 => ": the key given with --api-key (or CLARION_API_KEY) was refused",
        403 => ": the token given with --api-key does not allow this topic",
        413 if about_size => ": the server's max_publish_size is below this message",
        404 | 405 | 413 => {
            ": is --api (CLARION_API) the server's API listener (api_listen, 127.0.0.1:8081 by \
             default), not its client listener?"
        }
        _ => "",
    }
}

/// `s` percent-encoded for a URL path: every byte but unreserved characters and `:@/` (RFC
/// 3986 `pchar` and the segment separator). A valid topic comes out unchanged; anything that
/// could end the path (`?`, `#`) or split the request (spaces, line breaks) never goes out raw.
fn escape_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'@' | b'/')
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Largest answer head accepted: the API's are a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in an answer.
const MAX_HEADERS: usize = 32;

/// The status, body and `Retry-After` (whole seconds, as Clarion sends it) of a complete answer
/// read until the server closed the connection.
fn answer(response: &[u8]) -> anyhow::Result<(u16, Vec<u8>, Option<Duration>)> {
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
    let retry_after = head
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<u32>().ok())
        .map(|s| Duration::from_secs(u64::from(s)));
    Ok((head.status, body, retry_after))
}

/// Drops one line ending (`\n` or `\r\n`) from the end of a text message read from standard
/// input: `echo hi | clarion publish news` publishes `hi`, as `$(...)` in a shell would read
/// it. Only one: a message that ends with blank lines keeps them but the last. `--binary`
/// messages are sent as they are.
fn without_final_newline(buf: &mut Vec<u8>) {
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_message_from_stdin_loses_one_line_ending() {
        for (input, sent) in [
            (&b"hi\n"[..], &b"hi"[..]),
            (b"hi\r\n", b"hi"),
            (b"hi", b"hi"),
            (b"two\nlines\n\n", b"two\nlines\n"),
            (b"\n", b""),
            (b"", b""),
        ] {
            let mut buf = input.to_vec();
            without_final_newline(&mut buf);
            assert_eq!(buf, sent, "{input:?}");
        }
    }

    #[test]
    fn topics_are_escaped_in_the_path() {
        assert_eq!(
            escape_path("tenant:room/sub@eu-1.x_y"),
            "tenant:room/sub@eu-1.x_y"
        );
        assert_eq!(escape_path("news?event=evil"), "news%3Fevent%3Devil");
        assert_eq!(escape_path("a b#c\r\n%"), "a%20b%23c%0D%0A%25");
        assert_eq!(escape_path("é"), "%C3%A9");
    }

    /// A server that reads the request head only, answers `answer` and closes, as the API does
    /// for a message over max_publish_size.
    fn refusing_server(
        answer: &'static [u8],
    ) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
                if s.read(&mut byte).unwrap_or(0) == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            s.write_all(answer).unwrap();
            // Closing with the body unread makes the kernel reset the connection.
        });
        (addr, handle)
    }

    const REFUSAL: &[u8] = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 22\r\nConnection: close\r\n\r\n{\"error\":\"too large\"}\n";

    #[test]
    fn an_answer_given_before_the_body_is_read_is_shown() {
        let body = vec![b'x'; 32 << 20];
        for expect in [false, true] {
            let (addr, server) = refusing_server(REFUSAL);
            let mut stream = Link::Plain(TcpStream::connect(addr).unwrap());
            let head =
                b"POST /publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 33554432\r\n\r\n";
            let response = exchange(&mut stream, head, &body, expect).unwrap();
            let (status, text, _) = answer(&response).unwrap();
            assert_eq!(
                (status, &text[..]),
                (413, &b"{\"error\":\"too large\"}\n"[..])
            );
            server.join().unwrap();
        }
    }

    #[test]
    fn a_continue_lets_the_body_go() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut chunk = [0u8; 65536];
            while !got.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut chunk).unwrap();
                got.extend_from_slice(&chunk[..n]);
            }
            s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").unwrap();
            let mut body = 0;
            while body < 100_000 {
                body += s.read(&mut chunk).unwrap();
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes")
                .unwrap();
        });
        let mut stream = Link::Plain(TcpStream::connect(addr).unwrap());
        let head = b"POST /publish/news HTTP/1.1\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n";
        let response = exchange(&mut stream, head, &[b'y'; 100_000], true).unwrap();
        assert_eq!(answer(&response).unwrap(), (200, b"yes".to_vec(), None));
        server.join().unwrap();
    }

    #[test]
    fn reads_answers_by_their_framing() {
        let (status, body, _) =
            answer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}\n\nextra").unwrap();
        assert_eq!((status, &body[..]), (200, &b"{}\n\n"[..]));
        let (status, body, _) = answer(
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbad\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((status, &body[..]), (400, &b"bad"[..]));
        let (_, body, _) = answer(b"HTTP/1.0 200 OK\r\n\r\nall of it").unwrap();
        let (status, _, wait) = answer(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((status, wait), (503, Some(Duration::from_secs(1))));
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
