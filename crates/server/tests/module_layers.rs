//! The server's modules depend on each other one way only: configuration at the bottom, then
//! metrics and messages, then the hub, then the broker, and the modes and transports (GRIP,
//! workers, the API) on top. A lower module that names a higher one (`crate::grip` in the hub,
//! say) would make a cycle; this test reads the sources and fails when one does. A second test
//! checks the whole graph of top-level modules for cycles, so a module added later is covered
//! without a rule of its own. When one fails, move the shared piece down (into `config`,
//! `clarion_proto`, or a module both sides may use) rather than adding an edge back up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer's modules, and the crate modules they must not name.
const RULES: &[(&str, &[&str])] = &[
    (
        "config",
        &[
            "hub", "broker", "message", "metrics", "grip", "worker", "api", "server", "auth",
        ],
    ),
    (
        "metrics.rs",
        &[
            "config", "hub", "broker", "message", "grip", "worker", "api", "server", "auth",
        ],
    ),
    (
        "message.rs",
        &[
            "hub", "broker", "metrics", "grip", "worker", "api", "server",
        ],
    ),
    (
        "hub",
        &["broker", "grip", "worker", "api", "server", "auth"],
    ),
    ("broker", &["grip", "worker", "api", "server", "auth"]),
    // Backend hooks: the pool and the cache, beside GRIP (whose pool they share).
    ("hooks", &["worker", "api", "server", "dashboard"]),
    // Broker connections: below the modes, beside the broker (which will use them).
    (
        "cluster",
        &["broker", "grip", "worker", "api", "server", "dashboard"],
    ),
    (
        "auth",
        &[
            "hub", "broker", "message", "grip", "worker", "api", "server",
        ],
    ),
    // The process group supervises processes and merges their metrics text; the server and
    // the API call into it, so it must name nothing that serves clients.
    (
        "group",
        &[
            "hub",
            "broker",
            "message",
            "metrics",
            "grip",
            "worker",
            "api",
            "server",
            "auth",
            "dashboard",
            "tls",
            "publish",
        ],
    ),
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

/// The crate modules a file names (`crate::NAME`, and each NAME of `crate::{A, B::c}`), doc
/// comments included: a doc link is a dependency of the reader, too.
fn named_modules(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, m) in text.match_indices("crate::") {
        let after = &text[i + m.len()..];
        match after.strip_prefix('{') {
            Some(group) => {
                let inner = group.split('}').next().unwrap_or_default();
                // Only the first segment of each item names a module (`B` of `B::c`).
                out.extend(inner.split(',').map(ident).filter(|n| !n.is_empty()));
            }
            None => out.push(ident(after)),
        }
    }
    out
}

/// The top-level module a source file belongs to (`hub/topics.rs` and `hub.rs` are both
/// `hub`); `None` for the crate roots.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let first = first.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// Which top-level modules each top-level module names in code (comments left out: this graph
/// is about what the compiler links, the layer rules above also cover doc links).
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let deps = graph.entry(from.clone()).or_default();
        deps.extend(
            named_modules(&code)
                .into_iter()
                .filter(|to| *to != from && modules.contains(to)),
        );
    }
    graph
}

/// A path of modules from `start` back to itself, if there is one.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut path = vec![start.to_owned()];
    let mut seen = BTreeSet::new();
    // Depth-first, with an explicit stack of (module, its remaining successors).
    let mut stack: Vec<Vec<String>> =
        vec![graph.get(start).into_iter().flatten().cloned().collect()];
    while let Some(next) = stack.last_mut().and_then(|succ| succ.pop()) {
        if next == start {
            path.push(next);
            return Some(path);
        }
        if seen.insert(next.clone()) {
            stack.push(graph.get(&next).into_iter().flatten().cloned().collect());
            path.push(next);
        }
        while stack.last().is_some_and(|succ| succ.is_empty()) {
            stack.pop();
            path.pop();
        }
    }
    None
}

#[test]
fn no_cycles_between_top_level_modules() {
    let graph = module_graph();
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")];
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from.into()).or_default().insert(to.into());
    }
    assert_eq!(
        cycle_through(&graph, "a").map(|c| c.join(" -> ")),
        Some("a -> b -> c -> a".to_owned())
    );
    assert_eq!(cycle_through(&graph, "d"), None);
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
    assert_eq!(
        named_modules("use crate::{broker::Broker, log};"),
        vec!["broker", "log"]
    );
}
