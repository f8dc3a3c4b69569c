//! The Docker build (`make image`) sees only what `.dockerignore` allows and the
//! Dockerfile copies. Cargo reads every target the manifest declares even to build the
//! binary alone, and the crate embeds files with `include_str!`: each of them must be in
//! the build context and copied, or `docker build` fails on a machine we never test it on
//! (this machine has no Docker engine).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every workspace package's manifest and target source files (libs, bins, tests,
/// benches), relative to the repository.
fn cargo_target_sources() -> Vec<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    packages
        .iter()
        .map(|p| &p["manifest_path"])
        .chain(
            packages
                .iter()
                .flat_map(|p| p["targets"].as_array().unwrap())
                .map(|t| &t["src_path"]),
        )
        .map(|path| {
            Path::new(path.as_str().unwrap())
                .strip_prefix(repo())
                .expect("targets live in the repository")
                .to_path_buf()
        })
        .collect()
}

/// Files embedded into the crate with `include_str!`/`include_bytes!`, relative to the
/// repository.
fn embedded_files() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![repo().join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for macro_name in ["include_str!(\"", "include_bytes!(\""] {
                    for (at, _) in text.match_indices(macro_name) {
                        let rest = &text[at + macro_name.len()..];
                        let relative = &rest[..rest.find('"').unwrap()];
                        let file = path.parent().unwrap().join(relative);
                        let file = file.canonicalize().unwrap_or_else(|e| {
                            panic!("{} embeds {relative}: {e}", path.display())
                        });
                        found.push(
                            file.strip_prefix(repo().canonicalize().unwrap())
                                .unwrap()
                                .to_path_buf(),
                        );
                    }
                }
            }
        }
    }
    found
}

/// The top-level entries `.dockerignore` lets into the context (it is an allowlist:
/// `*`, then `!entry` lines).
fn context_allowlist() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        lines.first(),
        Some(&"*"),
        ".dockerignore starts by ignoring everything"
    );
    lines[1..]
        .iter()
        .map(|l| {
            l.strip_prefix('!')
                .unwrap_or_else(|| panic!("unexpected .dockerignore line {l:?}"))
                .trim_end_matches('/')
                .to_string()
        })
        .collect()
}

/// The sources the build stage copies (`COPY <src>... <dest>` lines before the first
/// runtime stage).
fn build_stage_copies() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let mut copies = Vec::new();
    let mut stages = 0;
    for line in text.lines().map(str::trim) {
        if line.starts_with("FROM ") {
            stages += 1;
        }
        if stages == 1 && line.starts_with("COPY ") && !line.contains("--from") {
            let args: Vec<&str> = line.split_whitespace().skip(1).collect();
            copies.extend(args[..args.len() - 1].iter().map(|a| a.to_string()));
        }
    }
    copies
}

fn top_level(path: &Path) -> String {
    path.components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_image_build_context_holds_every_file_cargo_needs() {
    let allowed = context_allowlist();
    let copied = build_stage_copies();
    let mut needed = cargo_target_sources();
    needed.extend(embedded_files());
    needed.push("Cargo.lock".into());
    assert!(
        needed.iter().any(|p| p.starts_with("sql")),
        "the PostgreSQL fence embeds its SQL: {needed:?}"
    );
    for file in &needed {
        let top = top_level(file);
        assert!(
            allowed.contains(&top),
            "{} is needed by cargo but .dockerignore keeps {top} out of the context (allowed: {allowed:?})",
            file.display()
        );
        assert!(
            copied
                .iter()
                .any(|c| c.trim_end_matches('/').trim_start_matches("./") == top),
            "{} is needed by cargo but the Dockerfile's build stage does not copy {top} (copies: {copied:?})",
            file.display()
        );
    }
}
