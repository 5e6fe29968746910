//! Mistakes in the TOML file said the way the environment's are: an unknown key is named with
//! its line and the closest setting, instead of serde's list of every key there is.

use super::SETTINGS;
use crate::spelling::closest;

/// For a file refused because it names a key that is no setting: where, and what was likely
/// meant. `None` for any other error (the TOML parser's own message says it well).
pub(super) fn unknown_setting(text: &str, error: &toml::de::Error) -> Option<String> {
    let message = error.message();
    let rest = message.strip_prefix("unknown field `")?;
    let key = rest.split('`').next()?;
    let line = error
        .span()
        .and_then(|s| text.get(..s.start))
        .map(|before| before.matches('\n').count() + 1);
    let at = line.map_or_else(String::new, |l| format!(" (line {l})"));
    let hint = match closest(key, SETTINGS.iter().map(|s| s.name)) {
        Some(name) => format!("did you mean `{name}`?"),
        None => "it is not a setting".to_owned(),
    };
    Some(format!(
        "unknown setting `{key}`{at}: {hint} Every setting: `clarion serve --help` and \
         docs/configuration.md"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn why(text: &str) -> Option<String> {
        let e = toml::from_str::<Config>(text).unwrap_err();
        unknown_setting(text, &e)
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line_and_the_closest_setting() {
        let w = why("listen = \":9000\"\nmax_conections = 10\n").unwrap();
        assert!(
            w.starts_with(
                "unknown setting `max_conections` (line 2): did you mean `max_connections`?"
            ),
            "{w}"
        );
        assert!(!w.contains("api_listen"), "no list of every key: {w}");
        let w = why("zzzzzz = 1\n").unwrap();
        assert!(w.contains("it is not a setting"), "{w}");
        assert!(why("listen = [\n").is_none());
    }
}
