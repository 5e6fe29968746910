//! The server's modules depend on each other one way only: configuration at the bottom, then
//! metrics and messages, then the hub, then the broker, and the modes and transports (GRIP,
//! workers, the API) on top. A lower module that names a higher one (`crate::grip` in the hub,
//! say) would make a cycle; this test reads the sources and fails when one does.

use std::path::{Path, PathBuf};

/// Each layer's modules, and the crate modules they must not name.
const RULES: &[(&str, &[&str])] = &[
    (
        "config.rs",
        &[
            "hub", "broker", "message", "metrics", "grip", "worker", "api", "server",
        ],
    ),
    (
        "metrics.rs",
        &[
            "config", "hub", "broker", "message", "grip", "worker", "api", "server",
        ],
    ),
    (
        "message.rs",
        &[
            "hub", "broker", "metrics", "grip", "worker", "api", "server",
        ],
    ),
    ("hub", &["broker", "grip", "worker", "api", "server"]),
    ("broker", &["grip", "worker", "api", "server"]),
];

fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).expect("source folder") {
        out.extend(sources(&entry.expect("entry").path()));
    }
    out
}

/// The crate modules a file names (`crate::NAME`), doc comments included: a doc link is a
/// dependency of the reader, too.
fn named_modules(text: &str) -> Vec<String> {
    text.match_indices("crate::")
        .map(|(i, m)| {
            text[i + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn lower_layers_never_name_higher_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (module, forbidden) in RULES {
        for file in sources(&src.join(module)) {
            let text = std::fs::read_to_string(&file).expect("readable source");
            for name in named_modules(&text) {
                if forbidden.contains(&name.as_str()) {
                    broken.push(format!("{} names crate::{name}", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn the_rule_reader_sees_paths_and_doc_links() {
    assert_eq!(
        named_modules("use crate::hub::Inbox; /// [`crate::grip`]"),
        vec!["hub", "grip"]
    );
}
