//! Checks the size rule for the tests: every Rust file under tests/ (recursively,
//! tests/support included) at most 800 lines, every fn at most 120 lines, counted
//! from its `fn` line to its closing brace, inclusive. Exits 1 listing every file
//! and fn over its limit (path:line, name, length); prints one OK line otherwise.
//! `make check` runs it.
//!
//! It reads the code as rustfmt writes it, without parsing Rust: a fn starts at a
//! line matching `^(\s*)(pub(\(\w+\))? )?(const )?(async )?(unsafe )?fn \w+` and
//! ends at the first later line that is exactly that indentation followed by `}`.
//! A one-line fn (its `}` on the `fn` line), or a declaration without a body (a
//! trait's `fn f();`), is one line long. Unformatted code can be measured wrongly.
//!
//! Usage: `palisade-test-sizes [DIR]`, DIR defaulting to the repository's tests/.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

/// One fn as the rule measures it.
#[derive(Debug, PartialEq, Eq)]
struct Func {
    name: String,
    /// 1-based line of its `fn`.
    line: usize,
    len: usize,
}

fn main() -> ExitCode {
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    // Canonical, so that paths are shown from the directory above it (`tests/...`).
    let dir = match dir.canonicalize() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("palisade-test-sizes: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    };
    let mut files = Vec::new();
    if let Err(e) = rust_files(&dir, &mut files) {
        eprintln!("palisade-test-sizes: reading {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    files.sort();
    let base = dir.parent().unwrap_or(&dir);
    let mut over = Vec::new();
    let mut fns = 0;
    for path in &files {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("palisade-test-sizes: reading {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        let shown = path
            .strip_prefix(base)
            .unwrap_or(path)
            .display()
            .to_string();
        over.extend(violations(&shown, &text));
        fns += functions(&text).len();
    }
    if over.is_empty() {
        println!(
            "test sizes OK: {} files, {fns} fns (files <= {MAX_FILE_LINES} lines, fns <= {MAX_FN_LINES})",
            files.len()
        );
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "test sizes: {} over the limits (files <= {MAX_FILE_LINES} lines, fns <= {MAX_FN_LINES}):",
            over.len()
        );
        for line in &over {
            eprintln!("  {line}");
        }
        ExitCode::FAILURE
    }
}

/// Every `*.rs` under `dir`, recursively (symlinks not followed into).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            rust_files(&path, out)?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// What is over the limits in one file, one line each.
fn violations(path: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines = text.lines().count();
    if lines > MAX_FILE_LINES {
        out.push(format!(
            "{path}: file, {lines} lines (max {MAX_FILE_LINES})"
        ));
    }
    for f in functions(text) {
        if f.len > MAX_FN_LINES {
            out.push(format!(
                "{path}:{}: fn {}, {} lines (max {MAX_FN_LINES})",
                f.line, f.name, f.len
            ));
        }
    }
    out
}

/// Every fn in `text`, by the rustfmt assumption in the doc comment above.
fn functions(text: &str) -> Vec<Func> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((indent, name)) = fn_start(line) else {
            continue;
        };
        let len = if one_line(line) {
            1
        } else {
            let close = format!("{indent}}}");
            match lines[i + 1..].iter().position(|l| *l == close) {
                Some(k) => k + 2,
                // No closing brace at its indentation: to the end of the file.
                None => lines.len() - i,
            }
        };
        out.push(Func {
            name: name.to_string(),
            line: i + 1,
            len,
        });
    }
    out
}

/// A `fn` line with its body or `;` on the same line.
fn one_line(line: &str) -> bool {
    let t = line.trim_end();
    t.ends_with(';') || (t.ends_with('}') && t.contains('{'))
}

/// The indentation and name of a line that starts a fn:
/// `^(\s*)(pub(\(\w+\))? )?(const )?(async )?(unsafe )?fn \w+`.
fn fn_start(line: &str) -> Option<(&str, &str)> {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let mut rest = body;
    if let Some(r) = rest.strip_prefix("pub") {
        let r = match r.strip_prefix('(') {
            Some(inner) => {
                let end = inner.find(')')?;
                let word = &inner[..end];
                if word.is_empty() || !word.chars().all(is_word) {
                    return None;
                }
                &inner[end + 1..]
            }
            None => r,
        };
        rest = r.strip_prefix(' ')?;
    }
    for word in ["const ", "async ", "unsafe "] {
        if let Some(r) = rest.strip_prefix(word) {
            rest = r;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c| !is_word(c)).unwrap_or(rest.len());
    if end == 0 {
        return None;
    }
    Some((indent, &rest[..end]))
}

/// `\w` as the rule's pattern means it.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_fn(indent: &str, head: &str, body_lines: usize) -> String {
        let mut s = format!("{indent}{head} {{\n");
        for i in 0..body_lines {
            s.push_str(&format!("{indent}    let x{i} = {i};\n"));
        }
        s.push_str(&format!("{indent}}}\n"));
        s
    }

    #[test]
    fn a_fn_runs_from_its_fn_line_to_its_closing_brace() {
        let text = format!("use std::fs;\n\n{}", sample_fn("", "fn small()", 3));
        assert_eq!(
            functions(&text),
            vec![Func {
                name: "small".into(),
                line: 3,
                len: 5
            }]
        );
    }

    #[test]
    fn qualifiers_and_visibility_are_recognised() {
        for head in [
            "pub fn a()",
            "pub(crate) fn a()",
            "pub(super) fn a()",
            "const fn a()",
            "async fn a()",
            "unsafe fn a()",
            "pub async unsafe fn a()",
            "pub(crate) const fn a()",
        ] {
            let f = functions(&sample_fn("", head, 1));
            assert_eq!(f.len(), 1, "{head}");
            assert_eq!((f[0].name.as_str(), f[0].len), ("a", 3), "{head}");
        }
        for not_fn in [
            "// fn a() {",
            "let fn_x = 1;",
            "pub(in crate::x) fn a() {",
            "fnord() {",
        ] {
            assert!(fn_start(not_fn).is_none(), "{not_fn}");
        }
    }

    #[test]
    fn a_nested_block_at_another_indentation_does_not_end_the_fn() {
        let text = "    #[tokio::test]\n    async fn outer() {\n        if x {\n            y();\n        }\n        fn inner() {\n            z();\n        }\n    }\n";
        let f = functions(text);
        assert_eq!(
            f,
            vec![
                Func {
                    name: "outer".into(),
                    line: 2,
                    len: 8
                },
                Func {
                    name: "inner".into(),
                    line: 6,
                    len: 3
                },
            ]
        );
    }

    #[test]
    fn a_multi_line_signature_counts_from_the_fn_line() {
        let text = "fn long(\n    a: u32,\n    b: u32,\n) -> u32 {\n    a + b\n}\n";
        assert_eq!(functions(text)[0].len, 6);
    }

    #[test]
    fn one_line_fns_and_declarations_are_one_line() {
        let text = "trait T {\n    fn decl(&self);\n    fn one(&self) -> u8 { 1 }\n}\n";
        let f = functions(text);
        assert_eq!(f.iter().map(|f| f.len).collect::<Vec<_>>(), vec![1, 1]);
    }

    #[test]
    fn fns_and_files_over_the_limits_are_reported_with_path_line_name_and_length() {
        let ok = sample_fn("", "fn fits()", MAX_FN_LINES - 2);
        assert!(violations("tests/a.rs", &ok).is_empty());
        let long = format!("\n{}", sample_fn("", "fn long()", MAX_FN_LINES - 1));
        assert_eq!(
            violations("tests/a.rs", &long),
            vec![format!(
                "tests/a.rs:2: fn long, {} lines (max {MAX_FN_LINES})",
                MAX_FN_LINES + 1
            )]
        );
        let big = "// x\n".repeat(MAX_FILE_LINES + 1);
        assert_eq!(
            violations("tests/b.rs", &big),
            vec![format!(
                "tests/b.rs: file, {} lines (max {MAX_FILE_LINES})",
                MAX_FILE_LINES + 1
            )]
        );
        assert!(violations("tests/c.rs", &"// x\n".repeat(MAX_FILE_LINES)).is_empty());
    }
}
