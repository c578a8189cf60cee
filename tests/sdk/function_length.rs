//! No function in `src/` spans more than [`MAX_LINES`] lines, from the line
//! of its `fn` to the line of its closing brace. The generated layer
//! (`src/api/generated.rs`) is left out. A function's body is found by
//! matching braces outside comments, strings and character literals.

use std::path::{Path, PathBuf};

/// The most lines a function may span.
const MAX_LINES: usize = 100;

/// Functions still over the limit, by file (relative to `src/`) and name;
/// each is to be split, then removed from here.
const OVER_THE_LIMIT: &[(&str, &str)] = &[];

/// Generated code, relative to `src/`.
const GENERATED: &[&str] = &["api/generated.rs"];

/// A function found in a file: its name, first line and line count.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
}

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

/// The text with every comment, string and character literal blanked out
/// (newlines kept), so that braces and `fn` are only the code's.
pub(super) fn code_only(text: &str) -> Vec<char> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(chars.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let after_ident = i > 0 && ident(chars[i - 1]);
        if rest.starts_with(&['/', '/']) {
            let end = (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len());
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(&['/', '*']) {
            let (mut depth, mut j) = (1, i + 2);
            while j < chars.len() && depth > 0 {
                if chars[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if chars[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !after_ident && raw_string_at(rest).is_some() {
            let (hashes, open) = raw_string_at(rest).unwrap_or_default();
            let mut j = i + open;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"'
                    && chars[j + 1..].iter().take_while(|&&c| c == '#').count() >= hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if chars[i] == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if chars[i] == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), or a lifetime.
            let end = if rest.get(1) == Some(&'\\') {
                (i + 3..chars.len()).find(|&j| chars[j] == '\'')
            } else if rest.get(2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end + 1);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// At a raw string (`r"`, `r#"`, `br#"`): its number of `#` and the length
/// of its opening.
fn raw_string_at(rest: &[char]) -> Option<(usize, usize)> {
    let after_b = usize::from(rest.first() == Some(&'b'));
    if rest.get(after_b) != Some(&'r') {
        return None;
    }
    let hashes = rest[after_b + 1..]
        .iter()
        .take_while(|&&c| c == '#')
        .count();
    let quote = after_b + 1 + hashes;
    (rest.get(quote) == Some(&'"')).then_some((hashes, quote + 1))
}

/// Every function with a body in a file's text.
fn functions(text: &str) -> Vec<Function> {
    let code = code_only(text);
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    // The line of each character.
    let lines: Vec<usize> = code
        .iter()
        .scan(1, |line, &c| {
            let at = *line;
            *line += usize::from(c == '\n');
            Some(at)
        })
        .collect();
    let line_at = |at: usize| lines[at];
    let mut found = Vec::new();
    for at in 0..code.len() {
        let is_fn = code[at..].starts_with(&['f', 'n'])
            && (at == 0 || !ident(code[at - 1]))
            && code.get(at + 2).is_some_and(|c| c.is_whitespace());
        if !is_fn {
            continue;
        }
        let mut i = at + 2;
        while code.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        let start = i;
        while code.get(i).is_some_and(|&c| ident(c)) {
            i += 1;
        }
        if i == start {
            continue; // a function pointer type, `fn (…)`
        }
        let name: String = code[start..i].iter().collect();
        // The signature ends at its body's `{`, or at `;` without one.
        let mut depth = 0usize;
        let open = loop {
            match code.get(i) {
                None => break None,
                Some('(' | '[') => depth += 1,
                Some(')' | ']') => depth = depth.saturating_sub(1),
                Some(';') if depth == 0 => break None,
                Some('{') if depth == 0 => break Some(i),
                Some(_) => {}
            }
            i += 1;
        };
        let Some(open) = open else { continue };
        let mut braces = 0usize;
        let close = (open..code.len()).find(|&j| {
            match code[j] {
                '{' => braces += 1,
                '}' => braces -= 1,
                _ => {}
            }
            braces == 0
        });
        let close = close.unwrap_or(code.len() - 1);
        found.push(Function {
            name,
            line: line_at(at),
            lines: line_at(close) - line_at(at) + 1,
        });
    }
    found
}

/// The functions of `src/` over `limit` lines, as `path:line fn name (n lines)`,
/// leaving out those in [`OVER_THE_LIMIT`].
fn too_long(limit: usize) -> (usize, Vec<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut counted = 0;
    let mut offenders = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .expect("a file under src/")
            .to_string_lossy()
            .replace('\\', "/");
        if GENERATED.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        for function in functions(&text) {
            counted += 1;
            let allowed = OVER_THE_LIMIT.contains(&(rel.as_str(), function.name.as_str()));
            if function.lines > limit && !allowed {
                offenders.push(format!(
                    "src/{rel}:{} fn {} ({} lines)",
                    function.line, function.name, function.lines
                ));
            }
        }
    }
    (counted, offenders)
}

#[test]
fn no_function_in_src_spans_more_than_the_limit() {
    let (counted, offenders) = too_long(MAX_LINES);
    assert!(counted > 1000, "only {counted} functions read");
    assert!(
        offenders.is_empty(),
        "functions over {MAX_LINES} lines (split them into named steps): {offenders:#?}"
    );
}

/// Every function of the allow-list exists and is still over the limit, so
/// the list shrinks as they are split.
#[test]
fn the_functions_allowed_over_the_limit_still_are() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (path, name) in OVER_THE_LIMIT {
        let text = std::fs::read_to_string(src.join(path)).expect("a listed file");
        let longest = functions(&text)
            .into_iter()
            .filter(|f| f.name == *name)
            .map(|f| f.lines)
            .max();
        assert!(
            longest.is_some_and(|lines| lines > MAX_LINES),
            "src/{path} fn {name} is listed as over {MAX_LINES} lines but is not \
             (longest: {longest:?}); take it off the list"
        );
    }
}

#[test]
fn the_reader_measures_functions_by_their_braces() {
    let text = r##"
/// fn not_this() { }
fn short() -> [u8; 2] {
    let s = "}}} fn quoted() {";
    let c = '}'; let q = '\'';
    let r = r#"" { "#;
    /* { nested /* } */ */
    [0; 2]
}

trait T {
    fn declared(&self);
    fn defaulted<'a>(&'a self, f: fn(u8) -> u8) where Self: Sized {
        let _ = f('{' as u8);
    }
}
"##;
    let found = functions(text);
    let summary: Vec<(&str, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.line, f.lines))
        .collect();
    assert_eq!(summary, [("short", 3, 7), ("defaulted", 13, 3)]);
}
