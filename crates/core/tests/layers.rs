//! The libraries' modules are layers, declared bottom first: `lib.rs` lists
//! core's modules in the order they may use one another (a module names only
//! modules declared before it), the torch crate's `lib.rs` and its
//! `train/mod.rs` likewise. A reference up the order fails here naming the
//! line, so a cycle (which needs one) cannot form, and the order written in
//! `lib.rs` and docs/engine.md stays the order the code has.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules `decl` declares, in order, leaving out test-only ones
/// (`#[cfg(test)]` on the line before), which may use anything.
fn declared(decl: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(decl).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(name) = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod ")) else { continue };
        let Some(name) = name.strip_suffix(';') else { continue };
        if n > 0 && lines[n - 1] == "#[cfg(test)]" {
            continue;
        }
        out.push(name.trim().to_string());
    }
    out
}

/// The names a path expression starting right after a prefix names: `a` in
/// `a::b`, and each of `a`, `c` in `{a::b, c}`.
fn names_after(after: &str) -> Vec<String> {
    if let Some(group) = after.strip_prefix('{') {
        let inner = group.split('}').next().unwrap_or("");
        inner.split(',').map(|p| p.trim().split("::").next().unwrap_or("").trim().to_string()).collect()
    } else {
        vec![after.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("").to_string()]
    }
}

/// Every module of `root` (declared in `decl`) that each file of `module`
/// names, through `prefix` (`crate::` for a crate root) or through as many
/// `super::` as lead from the file back to `root`, with the line that does.
fn references(root: &Path, prefix: &str, module: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    if root.join(module).is_dir() {
        rust_files(&root.join(module), &mut files);
    }
    if root.join(format!("{module}.rs")).is_file() {
        files.push(root.join(format!("{module}.rs")));
    }
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root).unwrap();
        // How many `super::` lead from this file's module back to `root`.
        let depth = rel.components().count() - usize::from(rel.ends_with("mod.rs"));
        let up = "super::".repeat(depth);
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for lead in [prefix, up.as_str()] {
                let mut rest = code;
                while let Some(at) = rest.find(lead) {
                    // Skip other crates' paths (`orchestrate_core::`, `$crate::`) and longer `super::` chains.
                    let before = rest[..at].chars().last();
                    let after = &rest[at + lead.len()..];
                    rest = after;
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':')
                        || after.starts_with("super::")
                    {
                        continue;
                    }
                    for name in names_after(after) {
                        if !name.is_empty() && name != module {
                            let place = format!("{}:{}: {}", file.display(), n + 1, line.trim());
                            found.push((name, place));
                        }
                    }
                }
            }
        }
    }
    found
}

/// Each reference from a module to one declared after it in `decl`.
fn upward(root: &Path, decl: &Path, prefix: &str) -> Vec<String> {
    let order = declared(decl);
    assert!(order.len() >= 2, "{} declares {order:?}", decl.display());
    let mut out = Vec::new();
    for (i, module) in order.iter().enumerate() {
        for (to, place) in references(root, prefix, module) {
            if let Some(j) = order.iter().position(|m| *m == to) {
                if j > i {
                    out.push(format!("{module} (layer {i}) uses {to} (layer {j}), declared above it:\n    {place}"));
                }
            }
        }
    }
    out
}

fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_core_modules_use_only_those_declared_before_them() {
    let src = crates().join("core/src");
    let found = upward(&src, &src.join("lib.rs"), "crate::");
    assert!(found.is_empty(), "references up the order of core/src/lib.rs:\n{}", found.join("\n"));
}

#[test]
fn the_torch_modules_use_only_those_declared_before_them() {
    let src = crates().join("torch/src");
    let found = upward(&src, &src.join("lib.rs"), "crate::");
    assert!(found.is_empty(), "references up the order of torch/src/lib.rs:\n{}", found.join("\n"));
    let train = src.join("train");
    let found = upward(&train, &train.join("mod.rs"), "crate::train::");
    assert!(found.is_empty(), "references up the order of torch/src/train/mod.rs:\n{}", found.join("\n"));
}

/// The check can fail: a module that names one declared after it is found,
/// through `crate::`, a `{...}` group, or `super::`.
#[test]
fn a_reference_up_the_order_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("lib.rs"), "pub mod low;\npub mod high;\n#[cfg(test)]\nmod tests;\n").unwrap();
    std::fs::create_dir(root.join("low")).unwrap();
    std::fs::write(root.join("low/mod.rs"), "pub mod inner;\n").unwrap();
    std::fs::write(root.join("low/inner.rs"), "use super::super::high::X; // up\n").unwrap();
    std::fs::write(root.join("high.rs"), "use crate::{low::Y, tests::Z};\n").unwrap();
    std::fs::write(root.join("tests.rs"), "use crate::high::X;\n").unwrap();
    let found = upward(root, &root.join("lib.rs"), "crate::");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("low (layer 0) uses high (layer 1)") && found[0].contains("inner.rs:1"), "{found:?}");
    std::fs::write(root.join("low/inner.rs"), "use crate::{high::X};\n").unwrap();
    assert_eq!(upward(root, &root.join("lib.rs"), "crate::").len(), 1);
    std::fs::write(root.join("low/inner.rs"), "use orchestrate_core::high::X;\n").unwrap();
    assert!(upward(root, &root.join("lib.rs"), "crate::").is_empty());
}

/// Lines of `files` that name `word` (comments aside), each as `path:line: text`;
/// with `code_only`, a file's unit tests (its last `#[cfg(test)] mod tests`) aside.
fn lines_naming(files: &[PathBuf], word: &str, code_only: bool) -> Vec<String> {
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let code =
                if code_only { text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or_default() } else { &text };
            code.lines()
                .enumerate()
                .filter(|(_, l)| l.contains(word) && !l.trim_start().starts_with("//"))
                .map(|(n, l)| format!("{}:{}: {}", f.display(), n + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Lines of the libraries' sources (the torch worker's `main.rs` aside) that name `word`.
fn library_lines_naming(word: &str) -> Vec<String> {
    let crates = crates();
    let mut files = Vec::new();
    for lib in ["core/src", "torch/src"] {
        rust_files(&crates.join(lib), &mut files);
    }
    let main = crates.join("torch/src/main.rs");
    files.retain(|f| *f != main);
    lines_naming(&files, word, false)
}

/// clap is the binaries' business: the core does not depend on it, and the
/// torch crate does only for its worker binary (Cargo has no per-target
/// dependencies), so this checks its library's sources.
#[test]
fn the_libraries_do_not_use_clap() {
    let offenders = library_lines_naming("clap::");
    assert!(offenders.is_empty(), "clap in library code:\n{}", offenders.join("\n"));
}

/// `anyhow` is for binaries; the libraries return their own `thiserror` types.
/// (The core does not even depend on it; the torch crate does, for its worker
/// binary only, so this checks its library's sources.)
#[test]
fn the_libraries_do_not_use_anyhow() {
    let offenders = library_lines_naming("anyhow");
    assert!(offenders.is_empty(), "anyhow in library code:\n{}", offenders.join("\n"));
}

/// Lines of the worker's sources (its benches and test modules aside) that
/// name `word`.
fn worker_lines_naming(word: &str) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&crates().join("torch/src"), &mut files);
    files.retain(|f| !f.ends_with("bench.rs") && !f.ends_with("tests.rs"));
    lines_naming(&files, word, true)
}

/// The worker writes its staging folder and the WAL folder the executor
/// names, and nothing else of the workspace: it opens no workspace, no
/// database of it (the guard's ledger is served to it over its stdin) and
/// publishes nothing into the store (its outputs, rollouts included, are
/// published by the executor from staging). Before, `train.grpo` opened
/// `guard.sqlite` and published every rollout into the object store itself.
#[test]
fn the_worker_opens_no_workspace_database_nor_store() {
    for word in ["Workspace::open", "Ledger::open", "open_at(", "publish_move", "object_path", "job.workspace"] {
        let offenders = worker_lines_naming(word);
        assert!(offenders.is_empty(), "the worker names {word}:\n{}", offenders.join("\n"));
    }
}

/// An op writes its outputs into staging through a writer that never follows
/// a link (`RunContext::write_output`, `fsx::write_file`, `fsx::copy_file`,
/// `fsx::open_truncate`: `O_NOFOLLOW`), as the worker's result file is:
/// `std::fs::write`, `File::create` or `fs::copy` to a name where a link was
/// planted would write whatever the link points to, outside the workspace.
#[test]
fn no_op_writes_into_staging_through_a_link() {
    let crates = crates();
    let mut files = Vec::new();
    for lib in ["core/src/ops", "torch/src"] {
        rust_files(&crates.join(lib), &mut files);
    }
    files.retain(|f| !f.ends_with("bench.rs") && !f.ends_with("tests.rs"));
    let mut offenders = Vec::new();
    for word in ["fs::write(", "File::create(", "fs::copy("] {
        offenders.extend(lines_naming(&files, word, true));
    }
    assert!(offenders.is_empty(), "writes that follow a link:\n{}", offenders.join("\n"));
}

/// How many times a source file's code (its unit tests aside) names
/// serde_json's `Value`: as `serde_json::Value`, or bare where the file
/// imports it (`Unit::Value` and other paths ending in `Value` are not it).
fn json_value_mentions(text: &str) -> usize {
    // Every test module (`#[cfg(test)]` then `mod NAME {`, to its closing
    // brace) and every comment line left out.
    let (mut lines, mut depth, mut after_cfg) = (Vec::new(), 0i64, false);
    for line in text.lines() {
        if depth > 0 || (after_cfg && line.trim_start().starts_with("mod ") && line.contains('{')) {
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            after_cfg = false;
            continue;
        }
        after_cfg = line.trim() == "#[cfg(test)]";
        if !line.trim_start().starts_with("//") {
            lines.push(line);
        }
    }
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mentions = |line: &str| -> Vec<usize> {
        line.match_indices("Value")
            .filter(|(at, _)| {
                !line[..*at].chars().next_back().is_some_and(ident)
                    && !line[at + "Value".len()..].chars().next().is_some_and(ident)
            })
            .map(|(at, _)| at)
            .collect()
    };
    let imported = lines
        .iter()
        .any(|l| l.trim_start().strip_prefix("use serde_json::").is_some_and(|rest| !mentions(rest).is_empty()));
    lines
        .iter()
        .map(|l| {
            mentions(l)
                .into_iter()
                .filter(|at| l[..*at].ends_with("serde_json::") || (imported && !l[..*at].ends_with("::")))
                .count()
        })
        .sum()
}

/// (Issue #35.) Where an untyped JSON value may still be, and how often: a
/// document with no schema of ours (the spec before it is typed, a user's
/// params and metrics files and imported rows, a model's `config.json` and
/// chat template, a signature bundle), canonical encoding, gate paths, and
/// the few our own contracts still carry. A new use fails here naming its
/// file, and one removed fails until its line below is lowered, so this
/// list stays the inventory docs/engine.md describes.
const JSON_VALUE_USES: &[(&str, usize)] = &[
    // The spec before it is typed: YAML read into JSON, merged, validated.
    ("core/src/spec/load.rs", 31),
    ("core/src/spec/yaml_json.rs", 19),
    ("core/src/spec/mod.rs", 19),
    ("core/src/spec/schema.rs", 9),
    ("core/src/spec/parsed.rs", 7),
    ("core/src/ops/mod.rs", 7),
    // Canonical encoding and gate paths.
    ("core/src/canonical.rs", 7),
    ("core/src/gate/mod.rs", 9),
    ("core/src/ops/gate.rs", 3),
    // The user's own documents: params and metrics files, imported rows, a
    // problem as a reward program reads it.
    ("core/src/docfile.rs", 37),
    ("core/src/data/table.rs", 22),
    ("core/src/ops/import.rs", 16),
    ("core/src/data/verifier.rs", 13),
    ("core/src/data/rows.rs", 3),
    ("core/src/ops/shell.rs", 5),
    ("core/src/reward/program.rs", 1),
    ("core/src/exec/check.rs", 1),
    ("torch/src/train/guarded.rs", 1),
    ("src/cli/tools.rs", 1),
    // Other tools' documents: a model's config.json and chat template, a
    // Sigstore bundle, a webhook's body.
    ("core/src/model/config.rs", 12),
    ("core/src/model/chat.rs", 8),
    ("core/src/model/tokenizer.rs", 7),
    ("core/src/ops/model.rs", 1),
    ("core/src/pack/sign.rs", 3),
    ("src/cli/events.rs", 3),
    // Our own contracts that still carry one.
    ("core/src/train/state.rs", 13),
    ("core/src/train/metrics.rs", 3),
    ("core/src/dag/key.rs", 5),
    ("core/src/record.rs", 4),
    ("core/src/pack/manifest.rs", 3),
    ("core/src/pack/mod.rs", 3),
];

#[test]
fn untyped_json_values_are_where_the_inventory_says() {
    let crates = crates();
    let mut files = Vec::new();
    for dir in ["core/src", "torch/src", "../src"] {
        rust_files(&crates.join(dir), &mut files);
    }
    files.retain(|f| !f.ends_with("tests.rs") && !f.ends_with("bench.rs"));
    let mut problems = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&crates).unwrap().to_string_lossy().replace("../", "");
        let found = json_value_mentions(&std::fs::read_to_string(f).unwrap());
        let listed = JSON_VALUE_USES.iter().find(|(p, _)| *p == rel).map(|(_, n)| *n);
        match listed {
            None if found > 0 => problems.push(format!("{rel}: {found} uses of serde_json::Value, and none listed")),
            Some(n) if n != found => problems.push(format!("{rel}: {found} uses of serde_json::Value, {n} listed")),
            _ => {}
        }
    }
    let total: usize = JSON_VALUE_USES.iter().map(|(_, n)| n).sum();
    assert!(problems.is_empty(), "update JSON_VALUE_USES (total {total}):\n{}", problems.join("\n"));
}

/// The count can fail: it finds the value named either way, and leaves out
/// other `Value`s, comments and unit tests.
#[test]
fn a_json_value_is_counted_however_it_is_named() {
    let text = "use serde_json::{json, Value};\nfn a(v: &Value) -> serde_json::Value { v.clone() }\n\
                // a Value in a comment\nlet u = Unit::Value; let m: MetricValue;\n\
                #[cfg(test)]\nmod tests {\n fn b(_: Value) {}\n}\nfn after(_: Value) {}\n";
    assert_eq!(json_value_mentions(text), 4);
    assert_eq!(json_value_mentions("enum NearZero { Value(f64) }\nlet x = NearZero::Value(1.0);"), 0);
    assert_eq!(json_value_mentions("fn a(v: serde_json::Value) {}"), 1);
}
