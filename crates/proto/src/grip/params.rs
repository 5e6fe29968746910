//! The parameter syntax of HTTP header values, as the `Grip-*` headers and
//! `Sec-WebSocket-Extensions` use it (RFC 9110 sections 5.6.1 to 5.6.6).
//!
//! A value is a comma-separated list of items; an item is a value followed by `; name=value`
//! parameters; values are tokens or quoted strings with backslash escapes. GRIP stretches this
//! a little: an item's value may be `<uri>` (which may hold `;` and `,`), and `Grip-Keep-Alive`
//! data is one item whose value is anything up to the first `;`. Parsing only splits and
//! unquotes; what the items mean is the caller's business.

/// An RFC 9110 token (header names, parameter names).
pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses comma-separated `name=value` pairs; values may be quoted strings.
pub(super) fn parse_pairs(value: &str) -> Result<Vec<(String, String)>, Syntax> {
    let mut c = Cursor { rest: value };
    let mut out = Vec::new();
    loop {
        c.skip_ws();
        if c.rest.is_empty() {
            return Ok(out);
        }
        if c.eat(',') {
            continue;
        }
        let name = c.until(&['=', ',', ';']).trim_end();
        if !is_token(name) || !c.eat('=') {
            return Err(Syntax);
        }
        c.skip_ws();
        let value = if c.eat('"') {
            c.quoted_tail().ok_or(Syntax)?
        } else {
            c.until(&[',', ';']).trim_end().to_string()
        };
        c.skip_ws();
        if !(c.rest.is_empty() || c.eat(',')) {
            return Err(Syntax);
        }
        out.push((name.to_string(), value));
    }
}

/// One list item: its value (unquoted) and its `; name=value` parameters (names lowercased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Item {
    pub(super) value: String,
    pub(super) params: Vec<(String, Option<String>)>,
}

/// The value did not follow the list syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Syntax;

/// Splits a header value into items. With `commas`, commas separate items (empty items are
/// skipped, as HTTP lists allow); without, the whole value is one item. A value may be a quoted
/// string, or `<...>` (a link, which may itself contain `;` and `,`).
pub(super) fn parse_list(value: &str, commas: bool) -> Result<Vec<Item>, Syntax> {
    let stops: &[char] = if commas { &[';', ','] } else { &[';'] };
    let mut c = Cursor { rest: value };
    let mut items = Vec::new();
    loop {
        c.skip_ws();
        if c.rest.is_empty() {
            return Ok(items);
        }
        if commas && c.eat(',') {
            continue;
        }
        let value = match c.peek() {
            Some('"') => {
                c.eat('"');
                c.quoted_tail().ok_or(Syntax)?
            }
            Some('<') => {
                let end = c.rest.find('>').ok_or(Syntax)?;
                c.take(end + 1).to_string()
            }
            _ => c.until(stops).trim_end().to_string(),
        };
        let mut params = Vec::new();
        loop {
            c.skip_ws();
            if c.rest.is_empty() || (commas && c.eat(',')) {
                break;
            }
            if !c.eat(';') {
                return Err(Syntax);
            }
            c.skip_ws();
            let name = c.until(&['=', ';', ',']).trim_end();
            if !is_token(name) {
                return Err(Syntax);
            }
            let value = if c.eat('=') {
                c.skip_ws();
                Some(if c.eat('"') {
                    c.quoted_tail().ok_or(Syntax)?
                } else {
                    c.until(stops).trim_end().to_string()
                })
            } else {
                None
            };
            params.push((name.to_ascii_lowercase(), value));
        }
        items.push(Item { value, params });
    }
}

/// A position in a header value.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.rest.chars().next()
    }

    fn skip_ws(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    /// The next `n` bytes (`n` is at a character boundary, found by `find`).
    fn take(&mut self, n: usize) -> &'a str {
        let (head, tail) = self.rest.split_at_checked(n).unwrap_or((self.rest, ""));
        self.rest = tail;
        head
    }

    /// Everything up to (not including) the first of `stops`, or the end.
    fn until(&mut self, stops: &[char]) -> &'a str {
        let end = self.rest.find(stops).unwrap_or(self.rest.len());
        self.take(end)
    }

    /// The rest of a quoted string whose opening quote was consumed: resolves `\` escapes and
    /// consumes the closing quote. `None` if it is not closed.
    fn quoted_tail(&mut self) -> Option<String> {
        let mut out = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((i, ch)) = chars.next() {
            match ch {
                '"' => {
                    self.rest = self.rest.get(i + 1..).unwrap_or_default();
                    return Some(out);
                }
                '\\' => out.push(chars.next()?.1),
                _ => out.push(ch),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(value: &str, params: &[(&str, Option<&str>)]) -> Item {
        Item {
            value: value.into(),
            params: params
                .iter()
                .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
                .collect(),
        }
    }

    #[test]
    fn lists_items_and_parameters() {
        assert_eq!(
            parse_list(
                r#" a ;X=1; y = "q\"uo,te" , , "b c"; flag, <u;v,w>; rel=next"#,
                true
            ),
            Ok(vec![
                item("a", &[("x", Some("1")), ("y", Some("q\"uo,te"))]),
                item("b c", &[("flag", None)]),
                item("<u;v,w>", &[("rel", Some("next"))]),
            ])
        );
        assert_eq!(parse_list("", true), Ok(vec![]));
        assert_eq!(
            parse_list(r"\n, x; format=cstring", false),
            Ok(vec![item(r"\n, x", &[("format", Some("cstring"))])])
        );
        for bad in [
            "\"open",
            "a; =1",
            "a; b c=1",
            "\"a\" b",
            "<open",
            "a; p=\"open",
        ] {
            assert_eq!(parse_list(bad, true), Err(Syntax), "{bad}");
        }
    }

    #[test]
    fn pairs() {
        assert_eq!(
            parse_pairs(r#"a=1, b="x, y", ,c="#),
            Ok(vec![
                ("a".into(), "1".into()),
                ("b".into(), "x, y".into()),
                ("c".into(), String::new())
            ])
        );
        for bad in ["a", "=1", "a=1; b=2", "a=\"x\" y"] {
            assert_eq!(parse_pairs(bad), Err(Syntax), "{bad}");
        }
    }

    #[test]
    fn tokens() {
        assert!(is_token("Content-Type"));
        assert!(is_token("x!#$%&'*+-.^_`|~9"));
        for bad in ["", "a b", "a:b", "é", "a\"b"] {
            assert!(!is_token(bad), "{bad}");
        }
    }
}
