//! The text form of a filter, as a `filter=` query parameter carries it (after URL decoding):
//!
//! ```text
//! filter  = or
//! or      = and ("or" and)*
//! and     = unary ("and" unary)*
//! unary   = "not" unary | "(" or ")" | compare
//! compare = KEY ("==" | "!=") STRING
//!         | KEY "in" "[" STRING ("," STRING)* "]"
//!         | KEY ("<" | "<=" | ">" | ">=") NUMBER
//! STRING  = '"' (any character but '"' and '\', or '\"', or '\\')* '"'
//! NUMBER  = "-"? DIGITS ("." DIGITS)? (("e" | "E") ("+" | "-")? DIGITS)?
//! ```
//!
//! Spaces, tabs and newlines separate tokens anywhere. Limits are checked while parsing: the
//! length first, then depth, comparisons and list sizes as they are met, so a hostile filter
//! costs at most its (bounded) length.

use super::canon::normalise;
use super::tags::{key_char, valid_key, MAX_KEY, MAX_VALUE};
use super::{CmpOp, Filter, FilterError, Limits, Num};

/// Parses `text` into a filter in canonical form, within `limits`.
pub fn parse(text: &str, limits: &Limits) -> Result<Filter, FilterError> {
    if text.len() > limits.max_len {
        return Err(FilterError::TooLong {
            len: text.len(),
            max: limits.max_len,
        });
    }
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
        terms: 0,
        limits,
    };
    p.skip_space();
    if p.at == p.s.len() {
        return Err(FilterError::Empty);
    }
    let f = p.or(0)?;
    p.skip_space();
    if p.at != p.s.len() {
        return Err(p.unexpected("`and`, `or` or the end of the filter"));
    }
    Ok(normalise(f))
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    terms: usize,
    limits: &'a Limits,
}

/// The comparison operators, longest first so `<=` is not read as `<`.
const OPERATORS: [(&str, Op); 6] = [
    ("==", Op::Eq),
    ("!=", Op::Ne),
    ("<=", Op::Cmp(CmpOp::Le)),
    (">=", Op::Cmp(CmpOp::Ge)),
    ("<", Op::Cmp(CmpOp::Lt)),
    (">", Op::Cmp(CmpOp::Gt)),
];

#[derive(Clone, Copy)]
enum Op {
    Eq,
    Ne,
    In,
    Cmp(CmpOp),
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self
            .peek()
            .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    fn unexpected(&self, expected: &'static str) -> FilterError {
        let found = match std::str::from_utf8(self.s.get(self.at..).unwrap_or_default()) {
            Ok(rest) => rest.chars().next().map(|c| format!("{c:?}")),
            // `at` is always on a character boundary: every token is ASCII.
            Err(_) => None,
        };
        FilterError::Unexpected {
            at: self.at,
            expected,
            found: found.unwrap_or_else(|| "the end of the filter".into()),
        }
    }

    /// The word (run of key characters) at the cursor, not consumed.
    fn word(&self) -> &'a str {
        let rest = self.s.get(self.at..).unwrap_or_default();
        let n = rest.iter().take_while(|&&c| key_char(c)).count();
        std::str::from_utf8(rest.get(..n).unwrap_or_default()).unwrap_or_default()
    }

    /// Consumes the keyword `kw` if it is the next word.
    fn keyword(&mut self, kw: &str) -> bool {
        self.skip_space();
        if self.word() == kw {
            self.at += kw.len();
            true
        } else {
            false
        }
    }

    fn deeper(&self, depth: usize) -> Result<usize, FilterError> {
        if depth + 1 > self.limits.max_depth {
            return Err(FilterError::TooDeep {
                max: self.limits.max_depth,
            });
        }
        Ok(depth + 1)
    }

    fn or(&mut self, depth: usize) -> Result<Filter, FilterError> {
        let mut parts = vec![self.and(depth)?];
        while self.keyword("or") {
            parts.push(self.and(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.swap_remove(0)
        } else {
            Filter::Or(parts)
        })
    }

    fn and(&mut self, depth: usize) -> Result<Filter, FilterError> {
        let mut parts = vec![self.unary(depth)?];
        while self.keyword("and") {
            parts.push(self.unary(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.swap_remove(0)
        } else {
            Filter::And(parts)
        })
    }

    fn unary(&mut self, depth: usize) -> Result<Filter, FilterError> {
        if self.keyword("not") {
            let d = self.deeper(depth)?;
            return Ok(Filter::Not(Box::new(self.unary(d)?)));
        }
        self.skip_space();
        if self.peek() == Some(b'(') {
            let d = self.deeper(depth)?;
            self.at += 1;
            let f = self.or(d)?;
            self.skip_space();
            if self.peek() != Some(b')') {
                return Err(self.unexpected("`)`"));
            }
            self.at += 1;
            return Ok(f);
        }
        self.compare()
    }

    fn compare(&mut self) -> Result<Filter, FilterError> {
        self.skip_space();
        let start = self.at;
        let key = self.word();
        if key.is_empty() {
            return Err(self.unexpected("a tag key, `not` or `(`"));
        }
        if !valid_key(key) {
            return Err(FilterError::BadKey {
                at: start,
                key: key.chars().take(MAX_KEY).collect(),
            });
        }
        self.at += key.len();
        self.terms += 1;
        if self.terms > self.limits.max_terms {
            return Err(FilterError::TooManyTerms {
                max: self.limits.max_terms,
            });
        }
        let key = key.to_owned();
        self.skip_space();
        let rest = self.s.get(self.at..).unwrap_or_default();
        let op = match OPERATORS
            .iter()
            .find(|(sym, _)| rest.starts_with(sym.as_bytes()))
        {
            Some((sym, op)) => {
                self.at += sym.len();
                *op
            }
            None if self.keyword("in") => Op::In,
            None => return Err(self.unexpected("==, !=, in, <, <=, > or >=")),
        };
        self.skip_space();
        match op {
            Op::Eq | Op::Ne => {
                let value = self.string(op_name(op), "key == \"3\"")?;
                let eq = Filter::Eq { key, value };
                Ok(match op {
                    Op::Ne => Filter::Not(Box::new(eq)),
                    Op::Eq | Op::In | Op::Cmp(_) => eq,
                })
            }
            Op::In => {
                if self.peek() != Some(b'[') {
                    return Err(self.unexpected("`[`"));
                }
                self.at += 1;
                let mut values = Vec::new();
                loop {
                    self.skip_space();
                    if values.len() == self.limits.max_list {
                        return Err(FilterError::ListTooLong {
                            max: self.limits.max_list,
                        });
                    }
                    values.push(self.string("in", "key in [\"a\", \"b\"]")?);
                    self.skip_space();
                    match self.peek() {
                        Some(b',') => self.at += 1,
                        Some(b']') => {
                            self.at += 1;
                            break;
                        }
                        Some(_) | None => return Err(self.unexpected("`,` or `]`")),
                    }
                }
                Ok(Filter::In { key, values })
            }
            Op::Cmp(c) => {
                let num = self.number(c.symbol())?;
                Ok(Filter::Cmp { key, op: c, num })
            }
        }
    }

    fn string(&mut self, op: &'static str, hint: &'static str) -> Result<String, FilterError> {
        match self.peek() {
            Some(b'"') => {}
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                return Err(FilterError::TypeMismatch {
                    at: self.at,
                    op,
                    wants: "strings",
                    hint,
                })
            }
            Some(_) | None => return Err(self.unexpected("a string in double quotes")),
        }
        let start = self.at;
        self.at += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return Err(FilterError::UnterminatedString { at: start }),
                Some(b'"') => {
                    self.at += 1;
                    break;
                }
                Some(b'\\') => {
                    match self.s.get(self.at + 1) {
                        Some(&c @ (b'"' | b'\\')) => out.push(c),
                        Some(_) | None => return Err(FilterError::BadEscape { at: self.at }),
                    }
                    self.at += 2;
                }
                Some(c) => {
                    out.push(c);
                    self.at += 1;
                }
            }
            if out.len() > MAX_VALUE {
                return Err(FilterError::ValueTooLong { max: MAX_VALUE });
            }
        }
        // The input is a &str and quotes and backslashes are ASCII, so the bytes between them
        // are whole characters.
        String::from_utf8(out).map_err(|_| FilterError::UnterminatedString { at: start })
    }

    fn number(&mut self, op: &'static str) -> Result<Num, FilterError> {
        let start = self.at;
        if self.peek() == Some(b'"') {
            return Err(FilterError::TypeMismatch {
                at: start,
                op,
                wants: "numbers",
                hint: "price < 3.5",
            });
        }
        let digits = |p: &mut Parser<'_>| {
            let from = p.at;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.at += 1;
            }
            p.at > from
        };
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let mut ok = digits(self);
        if ok && self.peek() == Some(b'.') {
            self.at += 1;
            ok = digits(self);
        }
        if ok && matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            ok = digits(self);
        }
        let text =
            std::str::from_utf8(self.s.get(start..self.at).unwrap_or_default()).unwrap_or_default();
        match (ok, text.parse::<f64>().ok().and_then(Num::new)) {
            (true, Some(n)) => Ok(n),
            (true, None) | (false, Some(_) | None) => Err(FilterError::BadNumber { at: start }),
        }
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Eq => "==",
        Op::Ne => "!=",
        Op::In => "in",
        Op::Cmp(c) => c.symbol(),
    }
}
