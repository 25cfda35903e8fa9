//! The library's top-level modules form a layered graph: no module reaches,
//! directly or through others, back into itself. A new cycle fails here with
//! the modules and the lines that close it.

use std::collections::{BTreeMap, BTreeSet};
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

/// The top-level modules each file of `module` names through `crate::`,
/// including those inside `crate::{a, b::c}` groups, with one line that does.
fn references(src: &Path, module: &str) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    let dir = src.join(module);
    if dir.is_dir() {
        rust_files(&dir, &mut files);
    }
    let file = src.join(format!("{module}.rs"));
    if file.is_file() {
        files.push(file);
    }
    let mut found = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                // Skip paths of other crates (`orchestrate_core::`, `$crate::`).
                let before = rest[..at].chars().last();
                let after = &rest[at + "crate::".len()..];
                rest = after;
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                    continue;
                }
                let names: Vec<&str> = if let Some(group) = after.strip_prefix('{') {
                    let inner = group.split('}').next().unwrap_or("");
                    inner.split(',').map(|p| p.trim().split("::").next().unwrap_or("").trim()).collect()
                } else {
                    vec![after.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("")]
                };
                for name in names.into_iter().filter(|n| !n.is_empty() && *n != module) {
                    let place = format!("{}:{}: {}", file.strip_prefix(src).unwrap().display(), n + 1, line.trim());
                    found.entry(name.to_string()).or_insert(place);
                }
            }
        }
    }
    found
}

#[test]
fn the_library_modules_have_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|l| l.trim_end_matches(';').trim().to_string())
        .collect();
    assert!(modules.len() >= 5, "lib.rs declares {modules:?}");
    let edges: BTreeMap<String, BTreeMap<String, String>> = modules
        .iter()
        .map(|m| {
            let refs = references(&src, m).into_iter().filter(|(to, _)| modules.contains(to)).collect();
            (m.clone(), refs)
        })
        .collect();

    // Depth-first search; a back edge is a cycle, reported with the lines that make it.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeMap<String, String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for (to, line) in &edges[m] {
            match state.get(to.as_str()).copied().unwrap_or(0) {
                0 => visit(to, edges, state, path, cycles),
                1 => {
                    let start = path.iter().position(|p| p == to).unwrap();
                    let mut ring: Vec<String> = path[start..].to_vec();
                    ring.push(to.clone());
                    let lines: Vec<String> = ring.windows(2).map(|w| format!("    {}", edges[&w[0]][&w[1]])).collect();
                    cycles.push(format!("{}\n{}", ring.join(" -> "), lines.join("\n")));
                    let _ = line;
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    let mut cycles = Vec::new();
    for m in edges.keys() {
        if state.get(m.as_str()).copied().unwrap_or(0) == 0 {
            visit(m, &edges, &mut state, &mut Vec::new(), &mut cycles);
        }
    }
    assert!(cycles.is_empty(), "module cycles in {}:\n{}", src.display(), cycles.join("\n"));
}

/// Lines of the libraries' sources (the torch worker's `main.rs` aside) that name `word`.
fn library_lines_naming(word: &str) -> Vec<String> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for lib in ["core/src", "torch/src"] {
        rust_files(&crates.join(lib), &mut files);
    }
    let main = crates.join("torch/src/main.rs");
    files
        .iter()
        .filter(|f| **f != main)
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.contains(word) && !l.trim_start().starts_with("//"))
                .map(|(n, l)| format!("{}:{}: {}", f.display(), n + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect()
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
