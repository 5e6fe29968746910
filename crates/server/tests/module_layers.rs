//! The server's modules depend on each other one way only: configuration at the bottom, then
//! metrics and messages, then the hub, then the broker, and the modes and transports (GRIP,
//! workers, the API) on top. A lower module that names a higher one (`crate::grip` in the hub,
//! say) would make a cycle; this test reads the sources and fails when one does. A second test
//! checks the whole graph of top-level modules for cycles, so a module added later is covered
//! without a rule of its own. When one fails, move the shared piece down (into `config`,
//! `clarion_proto`, or a module both sides may use) rather than adding an edge back up.
//!
//! A third test does the same for files, in every crate of the workspace: no file names
//! (`crate::`, `super::`, `self::`) another file that names it back, directly or around a longer
//! loop, inside a module as well as between modules. Paths reached only through a re-export of
//! a parent module count as naming the parent.

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
        "metrics",
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
    // Durable history: files under the hub's history, below the broker that calls it.
    (
        "durable",
        &["broker", "grip", "worker", "api", "server", "auth"],
    ),
    ("broker", &["grip", "worker", "api", "server", "auth"]),
    // Presence: rooms over the broker's fan-out; the workers and the API read it.
    (
        "presence",
        &["grip", "worker", "api", "server", "dashboard", "hooks"],
    ),
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
            // Only the first segment of each item names a module (`B` of `B::c` and of
            // `B::{c, d}`).
            Some(group) => out.extend(group_items(group).into_iter().map(ident)),
            None => out.push(ident(after)),
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// The top-level items of a use-group, given the text after its `{`: `a::{b, c}, d}` gives
/// `a::{b, c}` and `d` (a nested group stays whole; its commas are not the outer group's).
fn group_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// The paths one use-item stands for, each as its segments: `b::c` gives `b::c`, and
/// `b::{c, d::{e, f}}` gives `b::c`, `b::d::e` and `b::d::f`.
fn item_paths(item: &str) -> Vec<Vec<String>> {
    let item = item.trim();
    let (head, group) = match item.find('{') {
        Some(brace) => (&item[..brace], Some(&item[brace + 1..])),
        None => (item, None),
    };
    let stem: Vec<String> = head
        .split("::")
        .map(|seg| {
            seg.trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .take_while(|seg| !seg.is_empty())
        .collect();
    match group {
        None => vec![stem],
        Some(group) => group_items(group)
            .into_iter()
            .flat_map(item_paths)
            .map(|tail| stem.iter().cloned().chain(tail).collect())
            .collect(),
    }
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
        let files = sources(&src.join(module));
        // A rule whose module moved (a file became a folder) would check nothing.
        assert!(
            !files.is_empty(),
            "the rule for {module} names no source file"
        );
        for file in files {
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

/// Every crate's source folder in the workspace (`crates/*/src`).
fn crate_sources() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("crates folder")
        .map(|e| e.expect("entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    out.sort();
    out
}

/// The module path of a source file (`worker/conn.rs` is `worker::conn`, `worker/mod.rs` and
/// `worker.rs` are `worker`, the crate roots are empty).
fn file_module(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    Some(path)
}

/// The code of a file without comments and without its unit tests (the `#[cfg(test)]` module
/// at the bottom, whose `super::` is the file itself, with or without more attributes).
fn code_of(text: &str) -> String {
    let body = unit_tests_at(text).map_or(text, |at| &text[..at]);
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where a file's unit-test module starts: `#[cfg(test)]`, any further attribute lines, then
/// `mod tests`.
fn unit_tests_at(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find("\n#[cfg(test)]\n") {
        let at = from + i;
        let mut rest = &text[at + "\n#[cfg(test)]\n".len()..];
        while rest.starts_with("#[") {
            rest = rest.split_once('\n').map_or("", |(_, r)| r);
        }
        if rest.starts_with("mod tests") {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The paths a file names, resolved against its own module: `crate::a::b`, `super::c` (the
/// parent's `c`) and `self::d`, each as its segments. Groups (`crate::a::{b, c::d}`) give one
/// path per item.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let segments = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|seg| {
                seg.trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|seg| !seg.is_empty())
            .collect()
    };
    // The folder a file's `self::` and `super::` start from.
    let here: Vec<String> = module.to_vec();
    let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        ("super::", parent),
        ("self::", here),
    ] {
        for (i, m) in code.match_indices(prefix) {
            // `super::` inside a longer name or path (`a::super::`) is not a path start.
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let after = &code[i + m.len()..];
            // `crate::a::{b, c}`: the path up to the brace, then each item.
            let head_len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(after.len());
            let head = after[..head_len].trim_end_matches("::");
            let mut stem = base.clone();
            stem.extend(segments(head));
            match after[head_len..].strip_prefix('{') {
                Some(group) if after[..head_len].ends_with("::") || head.is_empty() => {
                    for tail in group_items(group).into_iter().flat_map(item_paths) {
                        out.push(stem.iter().cloned().chain(tail).collect());
                    }
                }
                _ => out.push(stem),
            }
        }
    }
    out
}

/// Which files each file of a crate names, as module paths: a named path belongs to the
/// longest module that is a file (`crate::worker::conn::Conn` to `worker::conn`).
fn file_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(src);
    let modules: BTreeMap<Vec<String>, &PathBuf> = files
        .iter()
        .filter_map(|f| Some((file_module(src, f)?, f)))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        if module.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        let deps = graph.entry(module.join("::")).or_default();
        for path in named_paths(&code_of(&text), module) {
            let owner = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| modules.contains_key(*p));
            if let Some(owner) = owner.filter(|o| *o != module.as_slice()) {
                deps.insert(owner.join("::"));
            }
        }
    }
    graph
}

/// File-level cycles not broken yet, each as the files it runs through. A cycle through other
/// files fails the test; so does an entry here that no longer has one (delete it then).
const KNOWN_FILE_CYCLES: &[&[&str]] = &[];

#[test]
fn no_cycles_between_files_in_any_crate() {
    let mut cycles = Vec::new();
    let mut known_seen = BTreeSet::new();
    for src in crate_sources() {
        let graph = file_graph(&src);
        for m in graph.keys() {
            let Some(c) = cycle_through(&graph, m) else {
                continue;
            };
            let known = KNOWN_FILE_CYCLES
                .iter()
                .position(|k| c.iter().all(|f| k.contains(&f.as_str())));
            match known {
                Some(k) => {
                    known_seen.insert(k);
                }
                None => cycles.push(format!("{}: {}", src.display(), c.join(" -> "))),
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
    let gone: Vec<_> = (0..KNOWN_FILE_CYCLES.len())
        .filter(|k| !known_seen.contains(k))
        .map(|k| KNOWN_FILE_CYCLES[k])
        .collect();
    assert!(
        gone.is_empty(),
        "known cycles now broken, delete them: {gone:?}"
    );
}

#[test]
fn the_path_reader_resolves_super_self_and_groups() {
    let module = vec!["worker".to_owned(), "conn".to_owned()];
    let paths = named_paths(
        "use super::state::State;\nuse crate::{hub::Inbox, config};\nuse self::x::Y;",
        &module,
    );
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        vec![
            "hub::Inbox",
            "config",
            "worker::state::State",
            "worker::conn::x::Y"
        ]
    );
}

#[test]
fn nested_use_groups_name_each_of_their_modules() {
    // `[hub, lock]` was read from this line before groups were parsed with their nesting.
    assert_eq!(
        named_modules("use crate::{hub::{Inbox, lock}, worker::Engine};"),
        vec!["hub", "worker"]
    );
    let module = vec!["worker".to_owned(), "conn".to_owned()];
    let joined: Vec<String> = named_paths(
        "use crate::{hub::{Inbox, lock::{A, B}}, worker::Engine};\nuse super::{state::{State, Kind}, io};",
        &module,
    )
    .iter()
    .map(|p| p.join("::"))
    .collect();
    assert_eq!(
        joined,
        vec![
            "hub::Inbox",
            "hub::lock::A",
            "hub::lock::B",
            "worker::Engine",
            "worker::state::State",
            "worker::state::Kind",
            "worker::io",
        ]
    );
}

/// The engine's core files: the record, the states, and the engine that holds them.
const CORE: &[&str] = &["worker::engine", "worker::conn", "worker::state"];
/// What the core must not name: the worker's features and its shell (`worker/mod.rs`), through
/// which every feature is reachable.
const ABOVE_CORE: &[&str] = &[
    "worker",
    "worker::transport",
    "worker::grip",
    "worker::presence",
    "worker::h2",
    "worker::shutdown",
];

/// The edges from a core file up to a feature or the shell, as `from -> to`.
fn core_breaks(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let above = |dep: &str| {
        ABOVE_CORE.iter().any(|f| {
            dep == *f || (*f != "worker" && dep.starts_with(f) && dep[f.len()..].starts_with("::"))
        })
    };
    let mut out = Vec::new();
    for core in CORE {
        for dep in graph.get(*core).into_iter().flatten() {
            if above(dep) {
                out.push(format!("{core} -> {dep}"));
            }
        }
    }
    out
}

#[test]
fn the_engine_core_names_no_feature_of_the_worker() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = file_graph(&src);
    for core in CORE {
        assert!(graph.contains_key(*core), "the core file {core} moved");
    }
    let broken = core_breaks(&graph);
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn unit_tests_are_found_under_more_attributes() {
    let text = "use a::b;\n#[cfg(test)]\n#[allow(clippy::unwrap_used)]\nmod tests {\n    use super::*;\n}\n";
    assert_eq!(code_of(text).trim(), "use a::b;");
    assert_eq!(
        code_of("use a::b;\n#[cfg(test)]\nmod tests {}\n").trim(),
        "use a::b;"
    );
}

#[test]
fn the_core_rule_finds_a_planted_feature_import() {
    let module = vec!["worker".to_owned(), "engine".to_owned()];
    let code = "use super::conn::Conn;\nuse crate::worker::{h2::H2, state::{Kind, State}};\nuse super::Shared;";
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let known = [
        "worker",
        "worker::conn",
        "worker::h2",
        "worker::state",
        "worker::engine",
    ];
    for path in named_paths(code, &module) {
        let owner = (1..=path.len())
            .rev()
            .map(|n| path[..n].join("::"))
            .find(|p| known.contains(&p.as_str()));
        if let Some(owner) = owner {
            graph
                .entry("worker::engine".into())
                .or_default()
                .insert(owner);
        }
    }
    assert_eq!(
        core_breaks(&graph),
        vec!["worker::engine -> worker", "worker::engine -> worker::h2"]
    );
}

/// What only the broker may name: its variants, and its Redis and NATS implementations. The
/// rest of the server asks the broker's seam (`crate::broker::Broker`) for what it needs
/// (rooms, occupancy, a hand-over's freeze), each a method with its one match inside
/// `broker/`, so a new broker is a variant and its arms there, not edits across the server.
const BROKER_PRIVATE: &[&str] = &[
    "Broker::Local",
    "Broker::Redis",
    "Broker::Nats",
    "broker::redis",
    "broker::nats",
    "RedisBroker",
    "NatsBroker",
];

/// The broker-private names `text` mentions, each once per mention (comments included: a
/// doc link to `broker::redis` is a reader's dependency on it, too).
fn broker_private_names(text: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for name in BROKER_PRIVATE {
        for (i, _) in text.match_indices(name) {
            // `Broker::Local` must not match inside a longer name (`Broker::LocalThing`).
            let next = text[i + name.len()..].chars().next();
            if !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.push(*name);
            }
        }
    }
    out
}

#[test]
fn no_file_outside_the_broker_names_a_broker_variant() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broker = src.join("broker");
    assert!(
        broker.is_dir(),
        "the broker's folder moved: update this rule"
    );
    let mut broken = Vec::new();
    for file in sources(&src) {
        if file.starts_with(&broker) || file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        for name in broker_private_names(&text) {
            broken.push(format!("{} names {name}", file.display()));
        }
    }
    assert!(
        broken.is_empty(),
        "ask the broker's seam instead: {broken:#?}"
    );
}

#[test]
fn the_broker_rule_sees_variants_and_implementations() {
    assert_eq!(
        broker_private_names(
            "if let Broker::Redis(b) = broker {}\nuse crate::broker::nats::X; /// [`crate::broker::redis::presence`]"
        ),
        vec!["Broker::Redis", "broker::redis", "broker::nats"]
    );
    // The constructor of the in-memory broker is part of the seam, not a variant.
    assert!(broker_private_names("let b = Broker::local(inboxes, m, l);").is_empty());
    assert_eq!(
        broker_private_names("Broker::Local(b) => b.freeze(),"),
        vec!["Broker::Local"]
    );
}
