//! `CLARION_*` environment variables that set nothing: a misspelt setting is warned about, with
//! the closest valid name, instead of being ignored in silence.
//!
//! The valid names are the settings' own variables ([`SETTINGS`]) and the few variables that
//! are not settings ([`OTHER_VARIABLES`]). This module only finds the mistakes; the caller
//! decides where to say so.

use super::SETTINGS;
use crate::spelling::closest;

/// `CLARION_*` variables that are not settings but are read by Clarion's commands or by the
/// tools around it, so an environment that holds them is not mistaken.
pub const OTHER_VARIABLES: &[&str] = &[
    // `clarion serve --config` and the log level.
    "CLARION_CONFIG",
    "CLARION_LOG",
    // `clarion publish --api`, `--cacert` and `--retry-for` (its key is the setting `api_key`'s
    // variable).
    "CLARION_API",
    "CLARION_CACERT",
    "CLARION_RETRY_FOR",
    // The test suites, the packages and bench/compare.py: which binary to run.
    "CLARION_BIN",
    "CLARION_BINARY_PATH",
    "CLARION_EXPECTED_VERSION",
    "CLARION_KEEP_INSTALLS",
    "CLARION_REF",
    "CLARION_REF_BIN",
];

/// Every valid `CLARION_*` name: the settings' variables, then [`OTHER_VARIABLES`].
pub fn known_variables() -> Vec<String> {
    SETTINGS
        .iter()
        .filter_map(|s| s.env())
        .chain(OTHER_VARIABLES.iter().map(|s| (*s).to_owned()))
        .collect()
}

/// One warning per `CLARION_*` name in `names` that Clarion does not read, naming the closest
/// valid variable when one is near enough to be the intended one.
pub fn unknown_variables<I, S>(names: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let known = known_variables();
    let mut out = Vec::new();
    for name in names {
        let name = name.as_ref();
        if !name.starts_with("CLARION_") || known.iter().any(|k| k == name) {
            continue;
        }
        let advice = match closest(name, known.iter().map(String::as_str)) {
            Some(k) => format!("did you mean {k}?"),
            None => "see docs/configuration.md for the settings".to_owned(),
        };
        out.push(format!(
            "{name} is not a Clarion variable and is ignored: {advice}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelt_variables_are_named_with_the_intended_one() {
        let w = unknown_variables(["CLARION_HISTROY_SIZE", "PATH", "CLARION_WORKERS"]);
        assert_eq!(
            w,
            vec![
                "CLARION_HISTROY_SIZE is not a Clarion variable and is ignored: did you mean \
                 CLARION_HISTORY_SIZE?"
            ]
        );
        let w = unknown_variables(["CLARION_MAXBACKLOG", "CLARION_API_KYE", "CLARION_LGO"]);
        assert!(w[0].ends_with("did you mean CLARION_MAX_BACKLOG?"), "{w:?}");
        assert!(w[1].ends_with("did you mean CLARION_API_KEY?"), "{w:?}");
        assert!(w[2].ends_with("did you mean CLARION_LOG?"), "{w:?}");
        let w = unknown_variables(["CLARION_SOMETHING_ELSE_ENTIRELY"]);
        assert!(
            w[0].ends_with("see docs/configuration.md for the settings"),
            "{w:?}"
        );
    }

    #[test]
    fn every_settings_variable_is_known() {
        // The list comes from the declarations: a setting added later is known without an edit.
        let names: Vec<String> = SETTINGS.iter().filter_map(|s| s.env()).collect();
        assert!(names.len() > 40);
        assert!(unknown_variables(&names).is_empty());
        assert!(unknown_variables(OTHER_VARIABLES).is_empty());
    }
}
