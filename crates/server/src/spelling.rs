//! Suggestions for misspelt names: which valid name a mistyped variable, setting or value was
//! most likely meant to be. Used by the configuration (unknown `CLARION_*` variables) and the
//! log (`CLARION_LOG` values); it depends on nothing.

/// The candidate nearest to `word` by edit distance (insertions, deletions, substitutions and
/// swaps of neighbours, case-insensitive; one candidate starting the other counts as one), when
/// it is near enough to be a slip: at most a third of the word's length, at least 1.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let limit = (word.len() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| {
            let lower = c.to_ascii_lowercase();
            // A word cut short or run on (`warning`, `deb`) is as near as one slip.
            let prefix = !word.is_empty() && (lower.starts_with(&word) || word.starts_with(&lower));
            let d = distance(&word, &lower);
            (if prefix { d.min(1) } else { d }, c)
        })
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Edit distance with adjacent transpositions (optimal string alignment), over bytes.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // Out-of-range cells cannot happen (every row has b.len() + 1 cells); reading one as "far"
    // keeps the function total without indexing.
    let at = |row: &[usize], j: usize| row.get(j).copied().unwrap_or(usize::MAX / 2);
    // Three rows: two back (for swaps), one back, and the current one.
    let mut two: Vec<usize> = vec![0; b.len() + 1];
    let mut one: Vec<usize> = (0..=b.len()).collect();
    let mut cur: Vec<usize> = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        if let Some(first) = cur.first_mut() {
            *first = i + 1;
        }
        for (j, &cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            let mut d = (at(&one, j) + cost)
                .min(at(&one, j + 1) + 1)
                .min(at(&cur, j) + 1);
            let swapped = i > 0 && j > 0 && a.get(i - 1) == Some(&cb) && b.get(j - 1) == Some(&ca);
            if swapped {
                d = d.min(at(&two, j - 1) + 1);
            }
            if let Some(cell) = cur.get_mut(j + 1) {
                *cell = d;
            }
        }
        std::mem::swap(&mut two, &mut one);
        std::mem::swap(&mut one, &mut cur);
    }
    at(&one, b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_count_slips() {
        assert_eq!(distance("history", "histroy"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn closest_is_none_when_nothing_is_near() {
        assert_eq!(closest("dbug", ["debug", "info", "warn"]), Some("debug"));
        assert_eq!(closest("WARNING", ["debug", "info", "warn"]), Some("warn"));
        assert_eq!(closest("loud", ["debug", "info", "warn"]), None);
    }
}
