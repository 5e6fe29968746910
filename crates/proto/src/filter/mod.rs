//! Subscription filters over publication tags: the language, its bounds, its canonical form and
//! its evaluation. Pure: the server decides where a filter comes from (a `filter=` query
//! parameter or a subscribe message's `"filter"`), caches one evaluation per publication per
//! distinct filter, and counts; this module only parses, normalises and evaluates.
//!
//! A publication carries tags, string keys and string values. A filter is an expression over
//! them (`docs/filters.md` has the grammar):
//!
//! ```text
//! sport == "football" and (league in ["a", "b"] or not live == "no") and price >= 2.5
//! ```
//!
//! Parsing gives a [`Filter`] in canonical form ([`canon`]): nested `and`/`or` flattened, their
//! operands sorted and deduplicated, `in` lists sorted and deduplicated, `!=` written as
//! `not ==`, double negations removed. Two filters that differ only in those respects are equal
//! and hash the same, so the server evaluates each distinct filter once per publication;
//! printing a filter ([`std::fmt::Display`]) gives text that parses back to the same filter.
//!
//! - [`mod@parse`]: the text form (URL query friendly), with positions in its errors.
//! - [`json`]: the JSON form, for a subscribe message, to and from [`Filter`].
//! - [`tags`]: the bounds of a publication's tags.

pub mod canon;
pub mod json;
pub mod parse;
pub mod tags;

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

pub use parse::parse;
pub use tags::{validate_tags, TagError};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests;

/// Bounds on a filter, enforced while parsing (text) or walking (JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of filter text (or of a JSON filter's strings and numbers together).
    pub max_len: usize,
    /// Nesting of `and`/`or`/`not`/parentheses.
    pub max_depth: usize,
    /// Comparisons (`==`, `!=`, `in`, `<`...) in the whole filter.
    pub max_terms: usize,
    /// Values in one `in` list.
    pub max_list: usize,
}

impl Default for Limits {
    /// A filter fits in a URL (1 KiB, far below any proxy's request-line limit), and a
    /// publication is evaluated against at most 32 comparisons per distinct filter (a few
    /// hundred nanoseconds), nested 8 deep (enough for hand-written filters, and the parser's
    /// recursion stays shallow), with `in` lists of 64 (a watch list of instruments).
    fn default() -> Limits {
        Limits {
            max_len: 1024,
            max_depth: 8,
            max_terms: 32,
            max_list: 64,
        }
    }
}

/// Why a filter was refused: each maps to a `400` answer (or an error message on a WebSocket)
/// with its [`std::fmt::Display`] text, and to a counter label ([`FilterError::reason`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The filter is empty.
    #[error("filter is empty")]
    Empty,
    /// The filter is longer than the limit.
    #[error("filter is {len} bytes, above the limit of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Nested deeper than the limit.
    #[error("filter nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// More comparisons than the limit.
    #[error("filter has more than {max} comparisons")]
    TooManyTerms {
        /// The limit.
        max: usize,
    },
    /// An `in` list longer than the limit.
    #[error("an `in` list has more than {max} values")]
    ListTooLong {
        /// The limit.
        max: usize,
    },
    /// Something else where the grammar expects `expected`.
    #[error("at byte {at}: expected {expected}, found {found}")]
    Unexpected {
        /// Byte offset in the filter text.
        at: usize,
        /// What the grammar allows there.
        expected: &'static str,
        /// What is there (`end of filter`, or the character).
        found: String,
    },
    /// A string without its closing quote.
    #[error("at byte {at}: string without its closing quote")]
    UnterminatedString {
        /// Where the string starts.
        at: usize,
    },
    /// A backslash not followed by `"` or `\`.
    #[error("at byte {at}: only \\\" and \\\\ are escapes")]
    BadEscape {
        /// Where the backslash is.
        at: usize,
    },
    /// A number that is not a finite decimal.
    #[error("at byte {at}: not a finite number")]
    BadNumber {
        /// Where the number starts.
        at: usize,
    },
    /// `==`, `!=` and `in` compare strings; `<`, `<=`, `>`, `>=` compare numbers.
    #[error("at byte {at}: {op} compares {wants}; write {hint}")]
    TypeMismatch {
        /// Where the value starts.
        at: usize,
        /// The operator.
        op: &'static str,
        /// What it compares.
        wants: &'static str,
        /// How to write it.
        hint: &'static str,
    },
    /// A tag key outside the tag key rules ([`tags::valid_key`]), or a keyword used as one.
    #[error(
        "at byte {at}: {key:?} is not a tag key (1-64 of A-Z a-z 0-9 _ . : - /, not and/or/not/in)"
    )]
    BadKey {
        /// Where the key starts (0 in the JSON form).
        at: usize,
        /// The key, cut to 64 bytes.
        key: String,
    },
    /// A string value longer than a tag value may be.
    #[error("a value is longer than {max} bytes")]
    ValueTooLong {
        /// The limit ([`tags::MAX_VALUE`]).
        max: usize,
    },
    /// A JSON filter that is not one of the documented forms.
    #[error("JSON filter: {0}")]
    Json(&'static str),
}

impl FilterError {
    /// A short fixed label for metrics (`clarion_filter_rejected_total{reason=...}`).
    pub fn reason(&self) -> &'static str {
        match self {
            FilterError::Empty => "empty",
            FilterError::TooLong { .. } => "too_long",
            FilterError::TooDeep { .. } => "too_deep",
            FilterError::TooManyTerms { .. } => "too_many_terms",
            FilterError::ListTooLong { .. } => "list_too_long",
            FilterError::Unexpected { .. } => "syntax",
            FilterError::UnterminatedString { .. } => "syntax",
            FilterError::BadEscape { .. } => "syntax",
            FilterError::BadNumber { .. } => "bad_number",
            FilterError::TypeMismatch { .. } => "type_mismatch",
            FilterError::BadKey { .. } => "bad_key",
            FilterError::ValueTooLong { .. } => "value_too_long",
            FilterError::Json(_) => "json",
        }
    }
}

/// A finite number of a comparison, ordered and hashed by value (`-0` is `0`).
#[derive(Debug, Clone, Copy)]
pub struct Num(f64);

impl Num {
    /// `None` for NaN and infinities.
    pub fn new(v: f64) -> Option<Num> {
        v.is_finite().then_some(Num(if v == 0.0 { 0.0 } else { v }))
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Num {
    fn eq(&self, other: &Num) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Num {}
impl Hash for Num {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h);
    }
}
impl PartialOrd for Num {
    fn partial_cmp(&self, other: &Num) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Num {
    fn cmp(&self, other: &Num) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl fmt::Display for Num {
    /// The shorter of the plain and the exponent form; both read back to the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plain = format!("{}", self.0);
        let exp = format!("{:e}", self.0);
        f.write_str(if exp.len() < plain.len() {
            &exp
        } else {
            &plain
        })
    }
}

/// A numeric comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CmpOp {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CmpOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    fn holds(self, tag: f64, n: f64) -> bool {
        match self {
            CmpOp::Lt => tag < n,
            CmpOp::Le => tag <= n,
            CmpOp::Gt => tag > n,
            CmpOp::Ge => tag >= n,
        }
    }
}

/// A filter expression. Built by [`parse()`] or [`json::from_json`] in canonical form; build one
/// by hand only through [`canon::normalise`] if it must compare equal to a parsed one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Filter {
    /// The tag `key` is present and equals `value`.
    Eq {
        /// Tag key.
        key: String,
        /// Expected value.
        value: String,
    },
    /// The tag `key` is present and equals one of `values` (sorted, distinct, two or more).
    In {
        /// Tag key.
        key: String,
        /// Accepted values.
        values: Vec<String>,
    },
    /// The tag `key` is present, reads as a finite number, and compares so with `num`.
    Cmp {
        /// Tag key.
        key: String,
        /// The comparison.
        op: CmpOp,
        /// The number it compares with.
        num: Num,
    },
    /// The operand does not hold (a missing tag makes `not k == "v"` hold).
    Not(Box<Filter>),
    /// Every operand holds (sorted, distinct, two or more, none an `And`).
    And(Vec<Filter>),
    /// Some operand holds (sorted, distinct, two or more, none an `Or`).
    Or(Vec<Filter>),
}

/// Where a filter finds a publication's tags.
pub trait Tags {
    /// The value of tag `key`, if the publication has it.
    fn tag(&self, key: &str) -> Option<&str>;
}

impl Tags for [(String, String)] {
    fn tag(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl Tags for std::collections::BTreeMap<String, String> {
    fn tag(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<S: std::hash::BuildHasher> Tags for std::collections::HashMap<String, String, S> {
    fn tag(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Filter {
    /// Whether a publication with these tags passes the filter.
    pub fn matches<T: Tags + ?Sized>(&self, tags: &T) -> bool {
        match self {
            Filter::Eq { key, value } => tags.tag(key) == Some(value.as_str()),
            // A linear scan: lists are short (`max_list`), and it holds for a hand-built
            // filter whose list is not sorted.
            Filter::In { key, values } => {
                tags.tag(key).is_some_and(|v| values.iter().any(|x| x == v))
            }
            Filter::Cmp { key, op, num } => tags
                .tag(key)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|v| v.is_finite() && op.holds(v, num.get())),
            Filter::Not(f) => !f.matches(tags),
            Filter::And(fs) => fs.iter().all(|f| f.matches(tags)),
            Filter::Or(fs) => fs.iter().any(|f| f.matches(tags)),
        }
    }
}

/// Writes a string value with its quotes, escaping `"` and `\`.
fn write_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("\"")
}

impl fmt::Display for Filter {
    /// The canonical text: operands in canonical order, parentheses only where needed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::Eq { key, value } => {
                write!(f, "{key} == ")?;
                write_str(f, value)
            }
            Filter::In { key, values } => {
                write!(f, "{key} in [")?;
                for (i, v) in values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write_str(f, v)?;
                }
                f.write_str("]")
            }
            Filter::Cmp { key, op, num } => write!(f, "{key} {} {num}", op.symbol()),
            Filter::Not(inner) => match inner.as_ref() {
                Filter::And(_) | Filter::Or(_) => write!(f, "not ({inner})"),
                Filter::Eq { .. } | Filter::In { .. } | Filter::Cmp { .. } | Filter::Not(_) => {
                    write!(f, "not {inner}")
                }
            },
            Filter::And(fs) => {
                for (i, x) in fs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" and ")?;
                    }
                    match x {
                        Filter::Or(_) => write!(f, "({x})")?,
                        Filter::Eq { .. }
                        | Filter::In { .. }
                        | Filter::Cmp { .. }
                        | Filter::Not(_)
                        | Filter::And(_) => write!(f, "{x}")?,
                    }
                }
                Ok(())
            }
            Filter::Or(fs) => {
                for (i, x) in fs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" or ")?;
                    }
                    write!(f, "{x}")?;
                }
                Ok(())
            }
        }
    }
}
