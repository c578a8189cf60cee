//! Imports run one way: no cycle among the modules of `src/`, whatever the
//! features. A module is a file; an edge is a path the file names
//! (`crate::a::b`, `super::x`, `self::y`, `use super::{a, b}`), resolved to
//! the deepest module file it reaches. A module's ancestors and descendants
//! are not edges: a parent declares its children, a child reads its
//! parent's items. Unit-test modules (`#[cfg(test)] mod tests { … }` at the
//! end of a file) are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).expect("a file under src/");
    let mut parts: Module = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its trailing unit tests.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> Option<&str> {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map_or(s.len(), |(i, _)| i);
    (end > 0).then(|| &s[..end])
}

/// Every path that starts with `crate`, `super` or `self`, as segments;
/// a brace group after it adds one path per name in the group.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        // The start of the path this `::` belongs to.
        let before = &code[..at];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |i| i + 1);
        if before[start..].contains("::") {
            continue; // not the first `::` of its path
        }
        let first = &code[start..at];
        if !matches!(first, "crate" | "super" | "self") {
            continue;
        }
        let mut segments = vec![first.to_owned()];
        let mut rest = &code[at..];
        while let Some(next) = rest.strip_prefix("::") {
            if let Some(group) = next.strip_prefix('{') {
                let close = group.find('}').unwrap_or(group.len());
                for item in group[..close].split(',') {
                    if let Some(name) = ident_at(item.trim_start()) {
                        let mut path = segments.clone();
                        path.push(name.to_owned());
                        out.push(path);
                    }
                }
                break;
            }
            let Some(name) = ident_at(next) else { break };
            segments.push(name.to_owned());
            rest = &next[name.len()..];
        }
        out.push(segments);
    }
    out
}

/// The deepest module a path reaches from `current`.
fn resolve(current: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let (mut base, mut rest) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (current.clone(), &path[1..]),
        Some("super") => (current.clone(), path),
        _ => return None,
    };
    while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
        base.pop();
        rest = tail;
    }
    let mut best = None;
    for n in 0..=rest.len() {
        let mut candidate = base.clone();
        candidate.extend(rest[..n].iter().cloned());
        if modules.contains(&candidate) {
            best = Some(candidate);
        }
    }
    best
}

fn is_prefix(a: &Module, b: &Module) -> bool {
    a.len() <= b.len() && b[..a.len()] == a[..]
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join(""), &mut files);
    let files: Vec<(Module, PathBuf)> = files
        .into_iter()
        .filter(|f| !f.starts_with(src.join("bin")))
        .map(|f| (module_of(&src, &f), f))
        .collect();
    let modules: BTreeSet<Module> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let targets = edges.entry(module.clone()).or_default();
        for path in paths_in(&code_of(&text)) {
            if let Some(target) = resolve(module, &path, &modules)
                && !is_prefix(&target, module)
                && !is_prefix(module, &target)
            {
                targets.insert(target);
            }
        }
    }
    edges
}

/// A cycle, if any (depth-first search).
fn cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = stack.iter().position(|m| m == node) {
            let mut found = stack[at..].to_vec();
            found.push(node.clone());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, done, stack) {
                return Some(found);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut done, &mut Vec::new()))
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn the_modules_of_src_import_one_way() {
    let edges = graph();
    assert!(edges.len() > 100, "only {} modules read", edges.len());
    if let Some(found) = cycle(&edges) {
        let names: Vec<String> = found.iter().map(name).collect();
        panic!("an import cycle: {}", names.join(" -> "));
    }
}

/// The servers reach the transport only through `transport::for_servers`.
#[test]
fn the_servers_use_the_transport_through_its_interface() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&src, f)).collect();
    let transport: Module = vec!["transport".to_owned()];
    let mut wrong = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        if !matches!(
            module.first().map(String::as_str),
            Some("mcp" | "local" | "web")
        ) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a source file");
        for path in paths_in(&code_of(&text)) {
            let Some(target) = resolve(&module, &path, &modules) else {
                continue;
            };
            let through = path.iter().position(|s| s == "transport");
            if is_prefix(&transport, &target)
                && through.and_then(|at| path.get(at + 1)).map(String::as_str)
                    != Some("for_servers")
            {
                wrong.push(format!("{}: {}", name(&module), path.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "transport internals reached directly: {wrong:#?}"
    );
}

#[test]
fn the_reader_sees_a_cycle() {
    let module = |s: &str| -> Module { s.split("::").map(str::to_owned).collect() };
    let modules: BTreeSet<Module> = ["local", "local::a", "local::b"].map(module).into();
    let a = paths_in("use super::b::Thing;\nfn f() { crate::local::a::g(); }");
    let b = paths_in("use super::{a, c};");
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, paths) in [("local::a", a), ("local::b", b)] {
        let from = module(from);
        for path in paths {
            if let Some(to) = resolve(&from, &path, &modules)
                && !is_prefix(&to, &from)
                && !is_prefix(&from, &to)
            {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    let found = cycle(&edges).expect("a -> b -> a");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 3);
}
