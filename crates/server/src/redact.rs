//! Secrets kept out of text meant for people (log lines, errors, `Debug` output): the password
//! or token in a URL's user part (`redis://:PASSWORD@host`, `nats://user:PASSWORD@host`,
//! `nats://TOKEN@host`) and the values of its query (`http://app/hook?token=VALUE`).
//!
//! Call sites print URLs through [`Urls`]; every log line and the fatal error are passed
//! through [`urls`] as well, so a URL that reaches a line some other way (inside a library's
//! error, say) is hidden too. Redaction errs on the side of hiding: what cannot be told apart
//! from a user part or a query value is hidden with it.

use std::borrow::Cow;
use std::fmt;

/// What replaces a hidden password, token or query value.
pub const HIDDEN: &str = "***";

/// `text` with the secrets of every URL in it hidden: the user part's password (`user:***@`)
/// or token (`***@`), and each query value (`?token=***`). Text without `://` is returned as
/// it is.
pub fn urls(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(p) = rest.find("://") {
        let start = p + 3;
        out.push_str(rest.get(..start).unwrap_or_default());
        let after = rest.get(start..).unwrap_or_default();
        let end = url_end(after);
        out.push_str(&hide_in(after.get(..end).unwrap_or_default()));
        rest = after.get(end..).unwrap_or_default();
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// [`urls`] as a `Display`: `format_args!("joined {}", Urls(url))`.
pub struct Urls<'a>(pub &'a str);

impl fmt::Display for Urls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&urls(self.0))
    }
}

/// `Debug` is the quoted redacted form, for `{:?}` in error messages.
impl fmt::Debug for Urls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*urls(self.0), f)
    }
}

/// Where the URL that starts `s` (just past its `://`) ends: at white space, or where the next
/// URL's scheme begins (`redis://a@h1,redis://b@h2` is two).
fn url_end(s: &str) -> usize {
    let ws = s.find(char::is_whitespace).unwrap_or(s.len());
    let within = s.get(..ws).unwrap_or_default();
    match within.find("://") {
        Some(next) => {
            let scheme = within.get(..next).unwrap_or_default();
            let scheme_len = scheme
                .bytes()
                .rev()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
                .count();
            next - scheme_len
        }
        None => ws,
    }
}

/// One URL past its `://` with its user part's secret and its query values hidden.
fn hide_in(url: &str) -> Cow<'_, str> {
    let (user, hostpath) = match url.rsplit_once('@') {
        Some(_) if at_is_in_the_query(url) => (None, url),
        Some((user, hostpath)) => (Some(user), hostpath),
        None => (None, url),
    };
    let query_at = hostpath.find('?');
    if user.is_none() && query_at.is_none() {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len());
    if let Some(user) = user {
        match user.split_once(':') {
            // `user:password`: the name helps, the password is hidden.
            Some((name, _)) if !name.contains(['/', '?', '#']) => {
                out.push_str(name);
                out.push(':');
                out.push_str(HIDDEN);
            }
            // A token alone, or something that cannot be told from one.
            Some(_) | None => out.push_str(HIDDEN),
        }
        out.push('@');
    }
    match query_at {
        Some(q) => {
            out.push_str(hostpath.get(..=q).unwrap_or_default());
            hide_query(hostpath.get(q + 1..).unwrap_or_default(), &mut out);
        }
        None => out.push_str(hostpath),
    }
    Cow::Owned(out)
}

/// Whether the last `@` of `url` (past its `://`) belongs to a query value
/// (`app/hook?mail=a@b`) rather than ending a user part: it follows a `?` whose query has a
/// `name=` before it, and what precedes the `?` is a plain `host[:port][/path]` (a password
/// holding `?` would leave a non-numeric "port" there, and is hidden as a user part).
fn at_is_in_the_query(url: &str) -> bool {
    let (Some(q), Some(at)) = (url.find('?'), url.rfind('@')) else {
        return false;
    };
    let named = at > q && url.get(q + 1..at).is_some_and(|v| v.contains('='));
    let before = url.get(..q).unwrap_or_default();
    let authority = before.split('/').next().unwrap_or_default();
    let port = match authority.rsplit_once(']') {
        Some((_, after)) => after.strip_prefix(':'),
        None => authority.rsplit_once(':').map(|(_, p)| p),
    };
    named && !before.contains('@') && port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// Writes `query` (past its `?`) with every value hidden; names, a fragment and a closing
/// quote (of a `{:?}`-quoted URL) are kept.
fn hide_query(query: &str, out: &mut String) {
    let end = query.find(['#', '"', '\'']).unwrap_or(query.len());
    let (pairs, tail) = query.split_at(end);
    for (i, pair) in pairs.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, _)) => {
                out.push_str(name);
                out.push('=');
                out.push_str(HIDDEN);
            }
            // A bare value (`?SECRET`) may be a token as well.
            None if pair.is_empty() => {}
            None => out.push_str(HIDDEN),
        }
    }
    out.push_str(tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_broker_url_form_loses_its_secret() {
        for (url, shown) in [
            ("redis://:pw1@127.0.0.1:6379", "redis://:***@127.0.0.1:6379"),
            ("redis://u:pw2@h:6379/3", "redis://u:***@h:6379/3"),
            (
                "rediss://:pw3@redis.example:6380",
                "rediss://:***@redis.example:6380",
            ),
            ("redis://pw4@h", "redis://***@h"),
            (
                "redis+sentinel://u:pw5@s1:26379,s2:26379/mymaster",
                "redis+sentinel://u:***@s1:26379,s2:26379/mymaster",
            ),
            (
                "rediss+cluster://:pw6@n1:7000,n2:7001",
                "rediss+cluster://:***@n1:7000,n2:7001",
            ),
            ("nats://u:pw7@[::1]:4222", "nats://u:***@[::1]:4222"),
            ("nats://tok8@h:4222", "nats://***@h:4222"),
            ("redis://:p@ss/w:rd@h", "redis://:***@h"),
            (
                "http://app/hook?token=t9&x=1",
                "http://app/hook?token=***&x=***",
            ),
            ("http://app/hook", "http://app/hook"),
            // An `@` in a query value leaves the host shown.
            (
                "http://app:8000/hook?mail=a@b&token=t",
                "http://app:8000/hook?mail=***&token=***",
            ),
            ("http://[::1]:80/h?m=a@b", "http://[::1]:80/h?m=***"),
            // A password holding `?` (unencoded) is still a password.
            ("redis://:pa?s=s@h", "redis://:***@h"),
            ("redis://u:p?x=1@h:6379", "redis://u:***@h:6379"),
            ("no url here", "no url here"),
        ] {
            assert_eq!(urls(url), shown, "{url}");
        }
    }

    #[test]
    fn urls_inside_a_line_and_lists_of_urls_are_hidden_each() {
        assert_eq!(
            urls("broker \"redis://:a1@h1\": no host; then nats://b2@h2:1,nats://u:c3@h3 x"),
            "broker \"redis://:***@h1\": no host; then nats://***@h2:1,nats://u:***@h3 x"
        );
        assert_eq!(
            format!("{:?}", Urls("http://h/p?k=v")),
            "\"http://h/p?k=***\""
        );
        assert_eq!(
            format!("{}", Urls("redis://:x@h")),
            format!("redis://:{HIDDEN}@h")
        );
    }
}
