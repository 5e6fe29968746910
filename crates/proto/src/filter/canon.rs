//! The canonical form of a filter: what makes two filters that mean the same by construction
//! (operand order, repetition, nesting of one operator, `in` with one value, double negation)
//! equal, so the server keeps one evaluation per distinct filter.

use super::Filter;

/// `f` in canonical form: `and`/`or` flattened into their own kind, operands sorted and
/// deduplicated, a group of one replaced by its operand; `in` lists sorted and deduplicated, a
/// list of one written as `==`; `not not x` written as `x`. Idempotent.
pub fn normalise(f: Filter) -> Filter {
    match f {
        Filter::Eq { .. } | Filter::Cmp { .. } => f,
        Filter::In { key, mut values } => {
            values.sort();
            values.dedup();
            match <[String; 1]>::try_from(values) {
                Ok([value]) => Filter::Eq { key, value },
                Err(values) => Filter::In { key, values },
            }
        }
        Filter::Not(inner) => match normalise(*inner) {
            Filter::Not(x) => *x,
            other @ (Filter::Eq { .. }
            | Filter::In { .. }
            | Filter::Cmp { .. }
            | Filter::And(_)
            | Filter::Or(_)) => Filter::Not(Box::new(other)),
        },
        Filter::And(fs) => group(fs, Group::And),
        Filter::Or(fs) => group(fs, Group::Or),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    And,
    Or,
}

fn group(fs: Vec<Filter>, kind: Group) -> Filter {
    let mut out = Vec::with_capacity(fs.len());
    for f in fs {
        match (normalise(f), kind) {
            (Filter::And(inner), Group::And) | (Filter::Or(inner), Group::Or) => out.extend(inner),
            (other, Group::And | Group::Or) => out.push(other),
        }
    }
    out.sort();
    out.dedup();
    match <[Filter; 1]>::try_from(out) {
        Ok([one]) => one,
        Err(out) => match kind {
            Group::And => Filter::And(out),
            Group::Or => Filter::Or(out),
        },
    }
}
