//! File deps as written in a spec, resolved against the tree at plan time:
//! a file, a folder (hashed as a tree of files) or a glob (`data/*.jsonl`,
//! `**` crossing folders), expanded sorted. Links are never followed: a dep
//! that is one, or a folder or glob that reaches one, is refused by name.

use std::path::Path;

use crate::store::fsx;

/// The most files one folder or glob dep may hold (each is in the key).
pub const MAX_DEP_FILES: usize = 100_000;

/// Whether a dep is a glob pattern rather than a path.
pub fn is_glob(dep: &str) -> bool {
    dep.contains(['*', '?', '[', '{'])
}

/// A folder or glob dep, hashed file by file into the key's `trees`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeDep {
    /// The dep as written (normalized): `data/prepared`, `data/*.jsonl`.
    pub name: String,
    pub kind: TreeKind,
}

impl TreeDep {
    /// The path (relative to the spec's folder) of the file a node record
    /// keys under `rel` for this dep: a folder's files are keyed by their
    /// path inside it, a glob's by their own.
    pub fn file(&self, rel: &str) -> String {
        match self.kind {
            TreeKind::Dir { .. } => format!("{}/{rel}", self.name),
            TreeKind::Glob { .. } => rel.to_string(),
        }
    }

    /// Whether the file at `path` (relative to the spec's folder) is keyed
    /// through this dep.
    pub fn covers(&self, path: &str) -> bool {
        match &self.kind {
            TreeKind::Dir { .. } => fsx::inside(path, &self.name) && !self.skips(path),
            TreeKind::Glob { matches } => matches.iter().any(|m| m == path),
        }
    }

    /// Whether `path` (relative to the spec's folder) is one a node writes
    /// inside this folder dep, an input of its own rather than hashed here.
    pub fn skips(&self, path: &str) -> bool {
        match &self.kind {
            TreeKind::Dir { skip } => skip.iter().any(|s| fsx::at_or_inside(path, s)),
            TreeKind::Glob { .. } => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeKind {
    /// A folder no node writes; `skip` are paths under it (relative to the
    /// spec's folder) that nodes write, which enter the key as inputs instead.
    Dir { skip: Vec<String> },
    /// A glob's matches on disk at plan time, relative to the spec's folder, sorted.
    Glob { matches: Vec<String> },
}

/// Compiles a glob as Snakemake and DVC read one: `*` and `?` stay within a
/// folder, `**` crosses folders.
pub fn glob_matcher(pattern: &str) -> Result<globset::GlobMatcher, DepsError> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|source| DepsError::Glob { pattern: pattern.to_string(), source })
}

/// Why a dep could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum DepsError {
    #[error("'{pattern}' is not a glob: {source}")]
    Glob {
        pattern: String,
        #[source]
        source: globset::Error,
    },
    #[error("{doing} {}: {source}", .path.display())]
    Io {
        doing: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{path}' is a symbolic link; deps are read from real files and folders only (links are never followed)")]
    Link { path: String },
    #[error("more than {MAX_DEP_FILES} files; a dep this large belongs in one archive")]
    TooManyFiles,
}

/// The folders a walk never enters: ours and other tools'
/// ([`reserved_folder`](crate::store::fsx::reserved_folder)), and Python's
/// bytecode cache, which Python writes itself from the `.py` files beside it
/// (that the key holds) when it imports them: in the key, every run of a
/// node importing from its own dep would change the dep it ran from.
fn skipped_folder(name: &str) -> bool {
    crate::store::fsx::reserved_folder(name).is_some() || name == "__pycache__"
}

/// Files under `root/rel` (relative to `root`, sorted), links refused by name.
/// With `glob`, only files it matches (relative to `root`) are kept.
pub fn walk(root: &Path, rel: &str, glob: Option<&globset::GlobMatcher>) -> Result<Vec<String>, DepsError> {
    let mut out = Vec::new();
    let mut stack = vec![rel.to_string()];
    while let Some(dir_rel) = stack.pop() {
        let dir = if dir_rel.is_empty() { root.to_path_buf() } else { root.join(&dir_rel) };
        let listing = |source| DepsError::Io { doing: "listing", path: dir.clone(), source };
        let entries = std::fs::read_dir(&dir).map_err(listing)?.collect::<Result<Vec<_>, _>>().map_err(listing)?;
        // A workspace (of any name) is never data: its files are left out.
        if entries.iter().any(|e| e.file_name() == crate::store::MARKER) && crate::store::is_workspace(&dir) {
            continue;
        }
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            // A checkout's copy of an out on its way into place (or left by a
            // killed one) is orchestrate's own, never data.
            if crate::store::fsx::is_checkout_temp_name(&name) {
                continue;
            }
            let child = if dir_rel.is_empty() { name.clone() } else { format!("{dir_rel}/{name}") };
            let ty =
                entry.file_type().map_err(|source| DepsError::Io { doing: "reading", path: entry.path(), source })?;
            if ty.is_symlink() {
                if glob.is_none_or(|g| g.is_match(&child)) {
                    return Err(DepsError::Link { path: child });
                }
            } else if ty.is_dir() {
                if !skipped_folder(&name) {
                    stack.push(child);
                }
            } else if ty.is_file() && glob.is_none_or(|g| g.is_match(&child)) {
                out.push(child);
                if out.len() > MAX_DEP_FILES {
                    return Err(DepsError::TooManyFiles);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The folder a glob's walk starts from: its leading components without a
/// glob character (`data/raw/*.csv` → `data/raw`).
pub fn glob_base(pattern: &str) -> String {
    let parts: Vec<&str> = pattern.split('/').take_while(|p| !is_glob(p)).collect();
    let n = if parts.len() == pattern.split('/').count() { parts.len().saturating_sub(1) } else { parts.len() };
    parts[..n].join("/")
}

/// Paths near a missing dep, for a did-you-mean: the entries of its nearest
/// existing folder, as paths relative to the spec's folder.
pub fn neighbours(root: &Path, dep: &str) -> Vec<String> {
    let mut folder = Path::new(dep).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    loop {
        let dir = if folder.is_empty() { root.to_path_buf() } else { root.join(&folder) };
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
            let mut out: Vec<String> = entries
                .flatten()
                .take(10_000)
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if folder.is_empty() {
                        name
                    } else {
                        format!("{folder}/{name}")
                    }
                })
                .collect();
            out.sort();
            return out;
        }
        match Path::new(&folder).parent() {
            Some(p) => folder = p.to_string_lossy().into_owned(),
            None => return Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_walks_from_its_literal_folder_and_star_stays_within_one() {
        assert_eq!(glob_base("data/raw/*.csv"), "data/raw");
        assert_eq!(glob_base("*.csv"), "");
        assert_eq!(glob_base("data/**/x.json"), "data");
        let dir = tempfile::tempdir().unwrap();
        for f in ["data/a.jsonl", "data/b.jsonl", "data/sub/c.jsonl", "data/n.txt"] {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let star = glob_matcher("data/*.jsonl").unwrap();
        assert_eq!(walk(dir.path(), "data", Some(&star)).unwrap(), ["data/a.jsonl", "data/b.jsonl"]);
        let deep = glob_matcher("data/**/*.jsonl").unwrap();
        assert_eq!(
            walk(dir.path(), "data", Some(&deep)).unwrap(),
            ["data/a.jsonl", "data/b.jsonl", "data/sub/c.jsonl"]
        );
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("data/z.jsonl")).unwrap();
        assert!(walk(dir.path(), "data", Some(&star)).unwrap_err().to_string().contains("symbolic link"));
    }
}
