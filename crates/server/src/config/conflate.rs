//! `[[conflate_topics]]`: topics whose slow subscribers get the latest value per key instead of
//! every update (docs/conflation.md). Each table names a topic `pattern`, the `key` of a
//! message (a JSON pointer into it), the unsent bytes (`threshold`) from which a subscriber is
//! conflated, and the most keys held per subscriber (`max_keys`).

use serde::Deserialize;

use clarion_proto::auth::Pattern;
use clarion_proto::conflate::KeySource;

use super::{Config, ConfigError};

/// One conflating topic pattern as configured.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConflateTopic {
    /// Topics it applies to (`prices`, `prices.*`, `*`), as `presence_topics`.
    pub pattern: String,
    /// Where a message's key is: a JSON pointer (`/id`); `""` is the whole message.
    pub key: String,
    /// Unsent bytes from which a subscriber of these topics is conflated (below
    /// `max_backlog`, which it then never reaches through these topics).
    #[serde(default = "default_threshold")]
    pub threshold: usize,
    /// Most keys held for one subscriber and topic; a message past it ends the subscriber as
    /// a slow consumer (its backlog is no longer bounded by the keys).
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// Most delivery rounds per second for each of these topics (1 to 1000), decided once per
    /// topic on each node: in between, the latest message per key is held and goes out at the
    /// interval's end (docs/conflation.md, "Debouncing"). Unset: every message goes at once.
    #[serde(default)]
    pub max_rate: Option<u32>,
}

fn default_threshold() -> usize {
    16 * 1024
}
fn default_max_keys() -> usize {
    1000
}

/// Largest `max_keys`: each key holds one message per slow subscriber.
const MAX_KEYS_CAP: usize = 100_000;
/// Largest `max_rate`: one round per millisecond, the debouncer's clock.
const MAX_RATE_CAP: u32 = 1000;

/// One rule, compiled for the workers.
#[derive(Debug)]
pub struct Rule {
    /// Topics it applies to.
    pub pattern: Pattern,
    /// Where a message's key is.
    pub key: KeySource,
    /// Unsent bytes from which a subscriber is conflated.
    pub threshold: usize,
    /// Most keys held per subscriber and topic.
    pub max_keys: usize,
    /// Most delivery rounds per second per topic (`max_rate`), if debounced.
    pub max_rate: Option<u32>,
}

/// The conflating topics, compiled once per process; empty when none is configured (then
/// fan-out never looks at them).
#[derive(Debug, Default)]
pub struct Rules(Vec<Rule>);

impl Rules {
    /// The rules of a validated configuration (an invalid table, which validation refuses,
    /// is left out).
    pub fn of(config: &Config) -> Rules {
        Rules(
            config
                .conflate_topics
                .iter()
                .filter_map(|t| {
                    Some(Rule {
                        pattern: Pattern::parse(&t.pattern).ok()?,
                        key: KeySource::parse(&t.key).ok()?,
                        threshold: t.threshold,
                        max_keys: t.max_keys,
                        max_rate: t.max_rate,
                    })
                })
                .collect(),
        )
    }

    /// Whether no topic conflates.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first rule covering `topic`.
    pub fn for_topic(&self, topic: &str) -> Option<&Rule> {
        self.0.iter().find(|r| r.pattern.matches(topic))
    }

    /// Whether some topic is debounced (`max_rate`).
    pub fn debounces(&self) -> bool {
        self.0.iter().any(|r| r.max_rate.is_some())
    }
}

impl Config {
    /// Checks `conflate_topics`: patterns and keys that parse, a threshold below
    /// `max_backlog`, a bounded number of keys.
    pub(crate) fn validate_conflate(&self) -> Result<(), ConfigError> {
        for t in &self.conflate_topics {
            let bad = |why: String| {
                ConfigError::Invalid(format!("conflate_topics {:?}: {why}", t.pattern))
            };
            Pattern::parse(&t.pattern).map_err(|e| bad(e.to_string()))?;
            // A pointer, or "field": the publish request's `conflation_key`.
            KeySource::parse(&t.key).map_err(|e| bad(e.to_string()))?;
            if t.threshold == 0 || t.threshold >= self.max_backlog {
                return Err(bad(format!(
                    "threshold must be between 1 and max_backlog ({}) - 1",
                    self.max_backlog
                )));
            }
            if t.max_rate.is_some_and(|r| r == 0 || r > MAX_RATE_CAP) {
                return Err(bad(format!(
                    "max_rate must be between 1 and {MAX_RATE_CAP} (deliveries per second)"
                )));
            }
            if t.max_keys == 0 || t.max_keys > MAX_KEYS_CAP {
                return Err(bad(format!(
                    "max_keys must be between 1 and {MAX_KEYS_CAP}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config(tables: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(tables).map_err(|e| e.to_string())?;
        c.validate_conflate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn conflate_topics_are_read_with_defaults_and_compiled() {
        let c = config("[[conflate_topics]]\npattern = \"prices.*\"\nkey = \"/id\"\n").unwrap();
        let rules = Rules::of(&c);
        let r = rules.for_topic("prices.fx").unwrap();
        assert_eq!((r.threshold, r.max_keys), (16 * 1024, 1000));
        assert_eq!(r.key, KeySource::Pointer("/id".into()));
        assert!(rules.for_topic("news").is_none());
        assert!(Rules::of(&config("").unwrap()).is_empty());
        assert!(!rules.debounces() && r.max_rate.is_none());
        let c = config("[[conflate_topics]]\npattern = \"p\"\nkey = \"\"\nmax_rate = 5\n").unwrap();
        assert_eq!(Rules::of(&c).for_topic("p").unwrap().max_rate, Some(5));
        assert!(Rules::of(&c).debounces());
        let c = config("[[conflate_topics]]\npattern = \"p\"\nkey = \"field\"\n").unwrap();
        assert_eq!(
            Rules::of(&c).for_topic("p").unwrap().key,
            KeySource::PublishField
        );
    }

    #[test]
    fn bad_conflate_topics_are_refused_with_the_reason() {
        let table = |extra: &str| format!("[[conflate_topics]]\npattern = \"p\"\n{extra}");
        for (extra, says) in [
            ("key = \"id\"", "not a JSON pointer"),
            ("key = \"/id\"\nthreshold = 0", "threshold"),
            ("key = \"/id\"\nthreshold = 65536", "threshold"),
            ("key = \"/id\"\nmax_keys = 0", "max_keys"),
            ("key = \"/id\"\nmax_keys = 100001", "max_keys"),
            ("key = \"/id\"\nmax_rate = 0", "max_rate"),
            ("key = \"/id\"\nmax_rate = 1001", "max_rate"),
            ("key = \"/id\"\nkeys = 3", "unknown field"),
        ] {
            let e = config(&table(extra)).unwrap_err();
            assert!(e.contains(says), "{extra}: {e}");
        }
    }
}
