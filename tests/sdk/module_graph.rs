//! Imports run one way: no cycle among the modules of `src/`, whatever the
//! features, and a module counts with everything below it. A module is a
//! file or an inline `mod name { … }` (a file pulled in with `include!`
//! belongs to the module that includes it). An edge is a path the code
//! names (`crate::a::b`, `super::x`, `self::y`, a child module by its name,
//! `use super::{a, b}`), resolved to the module that defines the item:
//! imports and re-exports (`use`, `pub use`) are followed to their source,
//! so `crate::Error` is an edge to `error`, not to the root. A child reading
//! an item one of its ancestors defines is no edge (a child reads its
//! parent's items). Any other edge stands for one between the two siblings
//! below the modules' deepest common ancestor: `a::b::c -> a::d` is
//! `a::b -> a::d`, so a loop through a parent and its child
//! (`a -> a::b -> c -> a`) is a loop. Unit tests (`mod tests`, `*_tests.rs`)
//! are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::function_length::code_only;

type Module = Vec<String>;

/// The longest chain of imports followed to find where an item is defined.
const MAX_HOPS: usize = 16;

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

/// The code of a file without comments, strings and its trailing unit tests.
fn code_of(text: &str) -> String {
    let code: String = code_only(text).into_iter().collect();
    match code.find("#[cfg(test)]\nmod tests {") {
        Some(at) => code[..at].to_owned(),
        None => code,
    }
}

fn ident_at(s: &str) -> Option<&str> {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map_or(s.len(), |(i, _)| i);
    (end > 0).then(|| &s[..end])
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path with a `::` in the code, as segments; a brace group after it
/// adds one path per name in the group.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        // The start of the path this `::` belongs to.
        let before = &code[..at];
        let start = before
            .rfind(|c: char| !(is_ident_char(c) || c == ':'))
            .map_or(0, |i| i + 1);
        if before[start..].contains("::") {
            continue; // not the first `::` of its path
        }
        let first = &code[start..at];
        if ident_at(first) != Some(first) {
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

/// The position of each whole word `word` in the code.
fn words_at<'a>(code: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    code.match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| {
            let before = code[..at].chars().next_back();
            let after = code[at + word.len()..].chars().next();
            !before.is_some_and(|c| is_ident_char(c) || c == ':')
                && after.is_some_and(char::is_whitespace)
        })
}

/// The inline modules of a module's code (`mod name { … }`; `mod tests`
/// left out), each with its body, and the code with their bodies blanked.
fn inline_modules(code: &str) -> (String, Vec<(String, String)>) {
    let chars: Vec<char> = code.chars().collect();
    let text: String = chars.iter().collect();
    let mut own = chars.clone();
    let mut found = Vec::new();
    let starts: Vec<usize> = words_at(&text, "mod")
        .map(|byte| text[..byte].chars().count())
        .collect();
    for at in starts {
        if own[at] == ' ' {
            continue; // inside a module blanked already
        }
        let mut i = at + 3;
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        let name_start = i;
        while chars.get(i).is_some_and(|&c| is_ident_char(c)) {
            i += 1;
        }
        let name: String = chars[name_start..i].iter().collect();
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        if name.is_empty() || chars.get(i) != Some(&'{') {
            continue; // `mod name;`
        }
        let mut depth = 0usize;
        let close = (i..chars.len()).find(|&j| {
            match chars[j] {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        let close = close.unwrap_or(chars.len() - 1);
        if name != "tests" {
            found.push((name, chars[i + 1..close].iter().collect()));
        }
        for c in &mut own[at..=close] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
    (own.into_iter().collect(), found)
}

/// A `use` tree's bindings: each name it brings into scope and the path it
/// names (a glob binds `*`).
fn use_tree(tree: &str, out: &mut Vec<(String, Vec<String>)>) {
    let mut tokens = Vec::new();
    let mut rest = tree.trim_start();
    while let Some(c) = rest.chars().next() {
        let len = if let Some(word) = ident_at(rest) {
            word.len()
        } else if rest.starts_with("::") {
            2
        } else if c.is_whitespace() {
            rest = rest.trim_start();
            continue;
        } else {
            c.len_utf8()
        };
        tokens.push(&rest[..len]);
        rest = &rest[len..];
    }
    let tokens: Vec<&str> = match tokens.first() {
        Some(&"::") => tokens[1..].to_vec(),
        _ => tokens,
    };
    parse_use(&tokens, 0, &[], out);
}

/// Parses one `use` tree from `at` under `prefix`; returns where it ends.
fn parse_use(
    tokens: &[&str],
    mut at: usize,
    prefix: &[String],
    out: &mut Vec<(String, Vec<String>)>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(at).copied() {
            Some("{") => {
                at += 1;
                while let Some(&token) = tokens.get(at) {
                    if token == "}" {
                        return at + 1;
                    }
                    at = parse_use(tokens, at, &path, out);
                    if tokens.get(at) == Some(&",") {
                        at += 1;
                    } else if tokens.get(at) != Some(&"}") {
                        return tokens.len();
                    }
                }
                return at;
            }
            Some("*") => {
                out.push(("*".to_owned(), path));
                return at + 1;
            }
            Some(word) if ident_at(word) == Some(word) => {
                path.push(word.to_owned());
                at += 1;
                match tokens.get(at).copied() {
                    Some("::") => at += 1,
                    Some("as") => {
                        if path.last().is_some_and(|s| s == "self") {
                            path.pop();
                        }
                        let alias = tokens.get(at + 1).copied().unwrap_or("_");
                        out.push((alias.to_owned(), path));
                        return at + 2;
                    }
                    _ => {
                        if path.last().is_some_and(|s| s == "self") {
                            path.pop();
                        }
                        if let Some(name) = path.last() {
                            out.push((name.clone(), path.clone()));
                        }
                        return at;
                    }
                }
            }
            _ => return tokens.len(),
        }
    }
}

/// What a module's `use` declarations bind: name → path as written.
fn imports_of(code: &str) -> BTreeMap<String, Vec<String>> {
    let mut bindings = Vec::new();
    for at in words_at(code, "use") {
        let statement = &code[at + 3..];
        let end = statement.find(';').unwrap_or(statement.len());
        use_tree(&statement[..end], &mut bindings);
    }
    let mut imports = BTreeMap::new();
    for (name, path) in bindings {
        imports.entry(name).or_insert(path);
    }
    imports
}

/// The modules of `src/` with their code and what their imports bind.
struct Tree {
    code: BTreeMap<Module, String>,
    imports: BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl Tree {
    /// A tree from each module's code (inline modules are split off).
    fn new(sources: impl IntoIterator<Item = (Module, String)>) -> Tree {
        let mut code: BTreeMap<Module, String> = BTreeMap::new();
        let mut pending: Vec<(Module, String)> = sources.into_iter().collect();
        while let Some((module, text)) = pending.pop() {
            let (own, inline) = inline_modules(&text);
            for (name, body) in inline {
                let mut child = module.clone();
                child.push(name);
                pending.push((child, body));
            }
            let entry = code.entry(module).or_default();
            entry.push('\n');
            entry.push_str(&own);
        }
        let imports = code
            .iter()
            .map(|(m, c)| (m.clone(), imports_of(c)))
            .collect();
        Tree { code, imports }
    }

    fn is_module(&self, module: &[String]) -> bool {
        self.code.contains_key(module)
    }

    /// The module that defines what `path` names in `current`, if the path
    /// starts in the crate: imports and re-exports are followed.
    fn defining(&self, current: &Module, path: &[String], hops: usize) -> Option<Module> {
        if hops > MAX_HOPS {
            return None;
        }
        let (mut base, mut rest): (Module, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (current.clone(), &path[1..]),
            "super" => (current.clone(), path),
            first => {
                let mut child = current.clone();
                child.push(first.to_owned());
                if self.is_module(&child) {
                    (child, &path[1..])
                } else {
                    let import = self.imports.get(current)?.get(first)?;
                    if import.len() < 2 {
                        return None;
                    }
                    let joined = [import.as_slice(), &path[1..]].concat();
                    return self.defining(current, &joined, hops + 1);
                }
            }
        };
        while let Some(tail) = rest.strip_prefix(&["super".to_owned()][..]) {
            base.pop();
            rest = tail;
        }
        while let Some((next, tail)) = rest.split_first() {
            let mut deeper = base.clone();
            deeper.push(next.clone());
            if !self.is_module(&deeper) {
                break;
            }
            base = deeper;
            rest = tail;
        }
        let Some((name, tail)) = rest.split_first() else {
            return Some(base);
        };
        match self.imports.get(&base).and_then(|i| i.get(name)) {
            Some(import) => {
                let joined = [import.as_slice(), tail].concat();
                Some(self.defining(&base, &joined, hops + 1).unwrap_or(base))
            }
            None => Some(base),
        }
    }

    /// Each module's edges: the modules defining what it names, leaving out
    /// itself and its ancestors.
    fn edges(&self) -> BTreeMap<Module, BTreeSet<Module>> {
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (module, code) in &self.code {
            let targets = edges.entry(module.clone()).or_default();
            let imported = self.imports[module].values().cloned();
            for path in paths_in(code).into_iter().chain(imported) {
                if let Some(target) = self.defining(module, &path, 0)
                    && !is_prefix(&target, module)
                {
                    targets.insert(target);
                }
            }
        }
        edges
    }
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

/// The modules of `src/` (the binaries left out); a file named by
/// `include!("…")` is read as part of the file that includes it.
fn tree() -> Tree {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let is_test = |m: &Module| m.iter().any(|s| s == "tests" || s.ends_with("_tests"));
    files.retain(|f| !f.starts_with(src.join("bin")) && !is_test(&module_of(&src, f)));
    let mut included = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        for (at, _) in text.match_indices("include!(\"") {
            let name = &text[at + 10..];
            let name = &name[..name.find('"').unwrap_or(0)];
            let dir = file.parent().expect("a directory");
            included.insert(dir.join(name), module_of(&src, file));
        }
    }
    Tree::new(files.iter().map(|file| {
        let module = included
            .get(file)
            .cloned()
            .unwrap_or_else(|| module_of(&src, file));
        let text = std::fs::read_to_string(file).expect("a source file");
        (module, code_of(&text))
    }))
}

/// The edges between siblings: each edge of `edges` between two modules
/// neither of which is below the other, as one between the two children of
/// their deepest common ancestor, with the first edge that made it.
fn siblings(
    edges: &BTreeMap<Module, BTreeSet<Module>>,
) -> BTreeMap<Module, BTreeMap<Module, String>> {
    let mut lifted: BTreeMap<Module, BTreeMap<Module, String>> = BTreeMap::new();
    for (from, targets) in edges {
        for to in targets {
            if is_prefix(from, to) || is_prefix(to, from) {
                continue;
            }
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            lifted
                .entry(from[..=common].to_vec())
                .or_default()
                .entry(to[..=common].to_vec())
                .or_insert_with(|| format!("{} -> {}", name(from), name(to)));
        }
    }
    lifted
}

/// A cycle, if any (depth-first search).
fn cycle<V>(edges: &BTreeMap<Module, BTreeMap<Module, V>>) -> Option<Vec<Module>> {
    fn visit<V>(
        node: &Module,
        edges: &BTreeMap<Module, BTreeMap<Module, V>>,
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
        for next in edges.get(node).into_iter().flat_map(BTreeMap::keys) {
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
    let edges = tree().edges();
    assert!(edges.len() > 100, "only {} modules read", edges.len());
    let lifted = siblings(&edges);
    if let Some(found) = cycle(&lifted) {
        panic!("an import cycle: {}", describe(&found, &lifted));
    }
}

/// A cycle of siblings, and the edge between modules behind each step.
fn describe(found: &[Module], lifted: &BTreeMap<Module, BTreeMap<Module, String>>) -> String {
    let names: Vec<String> = found.iter().map(name).collect();
    let why: Vec<&str> = found
        .windows(2)
        .map(|step| lifted[&step[0]][&step[1]].as_str())
        .collect();
    format!("{} ({})", names.join(" -> "), why.join("; "))
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

fn module(name: &str) -> Module {
    name.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A loop through a root re-export and a parent's child:
/// `store::recovery -> verify -> store` (`crate::Record` is `store`'s) is
/// `store -> verify -> store`; a child reading its parent's items is no
/// edge.
#[test]
fn the_reader_sees_a_loop_through_a_re_export_and_a_child() {
    let sources = |verify: &str| {
        Tree::new([
            (
                module(""),
                "mod store; mod verify; pub use store::Record;".to_owned(),
            ),
            (
                module("store"),
                "mod recovery; pub struct Record; const DIR: &str = \"\";\n\
                 fn f() { recovery::sweep(); }"
                    .to_owned(),
            ),
            (
                module("store::recovery"),
                "use super::DIR;\nfn sweep() { crate::verify::files(); }".to_owned(),
            ),
            (module("verify"), verify.to_owned()),
        ])
    };
    let edges = siblings(&sources("pub fn files() {}\nfn v(_: crate::Record) {}").edges());
    let found = cycle(&edges).expect("a loop");
    let names: Vec<String> = found.iter().map(name).collect();
    assert_eq!(names.first(), names.last());
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.contains(&"store".to_owned()), "{names:?}");
    assert!(names.contains(&"verify".to_owned()), "{names:?}");
    let why = describe(&found, &edges);
    assert!(why.contains("store::recovery -> verify"), "{why}");
    assert_eq!(
        cycle(&siblings(&sources("pub fn files() {}").edges())),
        None
    );
}

/// Imports, groups, renames and inline modules are read as written.
#[test]
fn the_reader_follows_imports_to_their_source() {
    let tree = Tree::new([
        (
            module(""),
            "pub mod a; pub mod b;\npub use a::{self as alias, deep::{Thing, Other as O}};\n\
             pub mod inline { pub use crate::b::Item; }\n#[cfg(test)]\nmod tests { use crate::b; }"
                .to_owned(),
        ),
        (module("a"), "pub mod deep;".to_owned()),
        (
            module("a::deep"),
            "pub struct Thing; pub struct Other;".to_owned(),
        ),
        (module("b"), "pub struct Item;".to_owned()),
    ]);
    let from = module("b");
    let defining = |path: &str| tree.defining(&from, &module(path), 0).map(|m| name(&m));
    assert_eq!(defining("crate::Thing").as_deref(), Some("a::deep"));
    assert_eq!(defining("crate::O").as_deref(), Some("a::deep"));
    assert_eq!(defining("crate::alias::deep").as_deref(), Some("a::deep"));
    assert_eq!(defining("crate::inline::Item").as_deref(), Some("b"));
    assert_eq!(defining("super::a::Missing").as_deref(), Some("a"));
    assert_eq!(defining("std::fmt"), None);
    assert!(!tree.is_module(&module("tests")));
}
