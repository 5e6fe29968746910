//! The JSON form of a filter, for a subscribe message (`{"type":"subscribe","topic":"t",
//! "filter":{...}}`): one key per object naming the operator.
//!
//! ```text
//! {"eq":["sport","football"]}        {"ne":["live","no"]}
//! {"in":["league",["a","b"]]}        {"lt":["price",2.5]}  (also "lte", "gt", "gte")
//! {"and":[F, F, ...]}  {"or":[F, F, ...]}  {"not":F}
//! ```
//!
//! The same bounds as the text form: every `and`/`or`/`not` is a level of depth, and the keys,
//! values and numbers together count against the length limit (a number as 8 bytes).

use serde_json::{Map, Value};

use super::canon::normalise;
use super::tags::{valid_key, MAX_KEY, MAX_VALUE};
use super::{CmpOp, Filter, FilterError, Limits, Num};

/// Reads a JSON filter into canonical form, within `limits`.
pub fn from_json(v: &Value, limits: &Limits) -> Result<Filter, FilterError> {
    let mut w = Walker {
        limits,
        terms: 0,
        len: 0,
    };
    let f = w.filter(v, 0)?;
    Ok(normalise(f))
}

/// The JSON form of a filter (of its canonical form, when it came from a parser).
pub fn to_json(f: &Filter) -> Value {
    let pair = |op: &str, key: &str, v: Value| {
        let mut m = Map::new();
        m.insert(op.into(), Value::Array(vec![Value::String(key.into()), v]));
        Value::Object(m)
    };
    let one = |op: &str, v: Value| {
        let mut m = Map::new();
        m.insert(op.into(), v);
        Value::Object(m)
    };
    match f {
        Filter::Eq { key, value } => pair("eq", key, Value::String(value.clone())),
        Filter::In { key, values } => pair(
            "in",
            key,
            Value::Array(values.iter().cloned().map(Value::String).collect()),
        ),
        Filter::Cmp { key, op, num } => {
            let name = match op {
                CmpOp::Lt => "lt",
                CmpOp::Le => "lte",
                CmpOp::Gt => "gt",
                CmpOp::Ge => "gte",
            };
            let n = serde_json::Number::from_f64(num.get()).map_or(Value::Null, Value::Number);
            pair(name, key, n)
        }
        Filter::Not(inner) => one("not", to_json(inner)),
        Filter::And(fs) => one("and", Value::Array(fs.iter().map(to_json).collect())),
        Filter::Or(fs) => one("or", Value::Array(fs.iter().map(to_json).collect())),
    }
}

struct Walker<'a> {
    limits: &'a Limits,
    terms: usize,
    len: usize,
}

impl Walker<'_> {
    fn spend(&mut self, n: usize) -> Result<(), FilterError> {
        self.len += n;
        if self.len > self.limits.max_len {
            return Err(FilterError::TooLong {
                len: self.len,
                max: self.limits.max_len,
            });
        }
        Ok(())
    }

    fn filter(&mut self, v: &Value, depth: usize) -> Result<Filter, FilterError> {
        let obj = v.as_object().ok_or(FilterError::Json(
            "a filter is an object with one operator key",
        ))?;
        let mut it = obj.iter();
        let (Some((op, arg)), None) = (it.next(), it.next()) else {
            return Err(FilterError::Json("a filter object has exactly one key"));
        };
        match op.as_str() {
            "and" | "or" | "not" => {
                if depth + 1 > self.limits.max_depth {
                    return Err(FilterError::TooDeep {
                        max: self.limits.max_depth,
                    });
                }
                if op == "not" {
                    return Ok(Filter::Not(Box::new(self.filter(arg, depth + 1)?)));
                }
                let items = arg
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or(FilterError::Json(
                        "and/or take a non-empty array of filters",
                    ))?;
                let fs = items
                    .iter()
                    .map(|x| self.filter(x, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(if op == "and" {
                    Filter::And(fs)
                } else {
                    Filter::Or(fs)
                })
            }
            "eq" | "ne" | "in" | "lt" | "lte" | "gt" | "gte" => self.compare(op, arg),
            _ => Err(FilterError::Json(
                "unknown operator (eq, ne, in, lt, lte, gt, gte, and, or, not)",
            )),
        }
    }

    fn compare(&mut self, op: &str, arg: &Value) -> Result<Filter, FilterError> {
        let (Some(Value::String(key)), Some(v), None) = (
            arg.get(0),
            arg.get(1),
            arg.as_array().and_then(|a| a.get(2)),
        ) else {
            return Err(FilterError::Json("a comparison is [key, value]"));
        };
        if !valid_key(key) {
            return Err(FilterError::BadKey {
                at: 0,
                key: key.chars().take(MAX_KEY).collect(),
            });
        }
        self.terms += 1;
        if self.terms > self.limits.max_terms {
            return Err(FilterError::TooManyTerms {
                max: self.limits.max_terms,
            });
        }
        self.spend(key.len())?;
        let key = key.clone();
        let cmp = match op {
            "lt" => Some(CmpOp::Lt),
            "lte" => Some(CmpOp::Le),
            "gt" => Some(CmpOp::Gt),
            "gte" => Some(CmpOp::Ge),
            _ => None,
        };
        if let Some(c) = cmp {
            let num = v
                .as_f64()
                .and_then(Num::new)
                .ok_or(FilterError::Json("lt/lte/gt/gte compare with a number"))?;
            self.spend(8)?;
            return Ok(Filter::Cmp { key, op: c, num });
        }
        if op == "in" {
            let items = v
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or(FilterError::Json("in takes a non-empty array of strings"))?;
            if items.len() > self.limits.max_list {
                return Err(FilterError::ListTooLong {
                    max: self.limits.max_list,
                });
            }
            let values = items
                .iter()
                .map(|x| self.value(x))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Filter::In { key, values });
        }
        let value = self.value(v)?;
        let eq = Filter::Eq { key, value };
        Ok(if op == "ne" {
            Filter::Not(Box::new(eq))
        } else {
            eq
        })
    }

    fn value(&mut self, v: &Value) -> Result<String, FilterError> {
        let s = v
            .as_str()
            .ok_or(FilterError::Json("eq/ne/in compare with strings"))?;
        if s.len() > MAX_VALUE {
            return Err(FilterError::ValueTooLong { max: MAX_VALUE });
        }
        self.spend(s.len())?;
        Ok(s.to_owned())
    }
}
