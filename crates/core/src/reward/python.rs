//! What Python runs of the spec's folder: the files of a module run with
//! `-m`, and the modules of the folder a program imports, found in its
//! source as Python finds them on `sys.path[0]` (the script's folder, or the
//! working folder for `-m`). A reward program and a `shell` node's command
//! key these files, so an edit of `model.py` that `train.py` imports re-runs
//! the node as an edit of `train.py` does (DVC and Snakemake re-run only for
//! declared deps).
//!
//! Only `import` and `from … import` statements are read; an import made at
//! run time (`importlib.import_module(name)`, `__import__`) or through
//! another path (`PYTHONPATH`, `sys.path.insert`) is not found. A statement
//! inside a string or a comment is not one; one that never runs (under `if
//! TYPE_CHECKING:` or in a `try:` whose `except` takes over) is found, which
//! keys a file more, never one less.

use std::collections::BTreeSet;
use std::path::Path;

use crate::store::fsx::{normalize_rel, parent_rel};

/// The files Python may run for `-m MODULE` from the spec's folder (the
/// first entry of its `sys.path`): the `__init__.py` of each package on the
/// way, and `MODULE.py` or, for a package, its `__init__.py` and
/// `__main__.py`. Those of them that exist are the program's files; a module
/// installed elsewhere has none here. A name that is not dotted identifiers
/// names none.
pub(crate) fn python_module_files(module: &str) -> Vec<String> {
    let Some(parts) = dotted(module) else { return Vec::new() };
    let mut out = Vec::new();
    for n in 1..parts.len() {
        out.push(format!("{}/__init__.py", parts[..n].join("/")));
    }
    let path = parts.join("/");
    out.push(format!("{path}.py"));
    out.push(format!("{path}/__init__.py"));
    out.push(format!("{path}/__main__.py"));
    out
}

/// `a.b.c` as its names, if each is an identifier.
fn dotted(module: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = module.split('.').collect();
    parts.iter().all(|p| is_identifier(p)).then_some(parts)
}

fn is_identifier(p: &str) -> bool {
    !p.is_empty() && !p.starts_with(|c: char| c.is_ascii_digit()) && p.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The most files one program's imports are followed through, and the
/// largest source read for its imports: a folder of generated code is not
/// walked without end.
const MAX_MODULES: usize = 4096;
const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// What Python runs first of a program (the script, or a module's files,
/// relative to the spec's folder) and the folder first on its `sys.path`
/// (the script's folder, or the working folder for `-m`; `""` for the
/// spec's own): what [`imported_files`] starts from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PythonRun {
    pub files: Vec<String>,
    pub path0: String,
    /// The code of `python3 -c CODE`, whose imports are found as a file's.
    pub code: Option<String>,
}

impl PythonRun {
    /// A script, or a folder's `__main__.py`, run from `path0`.
    pub fn script(file: String, path0: String) -> PythonRun {
        PythonRun { files: vec![file], path0, code: None }
    }

    /// A script given by path whose first line names Python (`#!/usr/bin/env
    /// python3`), run with its folder first on `sys.path`.
    pub fn by_shebang(spec_dir: &Path, file: &str) -> Option<PythonRun> {
        PythonRun::of_shebang(&shebang(spec_dir, file)?, file)
    }

    /// [`PythonRun::by_shebang`], from the file's `#!` line ([`shebang`]).
    pub fn of_shebang(line: &str, file: &str) -> Option<PythonRun> {
        line.split_whitespace()
            .any(names_python)
            .then(|| PythonRun::script(file.to_string(), parent_rel(file).to_string()))
    }
}

/// Whether `word` (a command's first word, `/usr/bin/python3`) is Python.
pub(crate) fn names_python(word: &str) -> bool {
    let name = word.rsplit('/').next().unwrap_or(word);
    name.starts_with("python") || name.starts_with("pypy")
}

/// What follows `#!` on a file's first line (`/usr/bin/env python3 -u`),
/// read from its first 128 bytes, never through a link; none for a file
/// without one.
pub(crate) fn shebang(spec_dir: &Path, file: &str) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 128];
    let mut opened = crate::store::fsx::open_user_file(spec_dir, file).ok()?;
    let n = opened.read(&mut head).ok()?;
    let line = head[..n].split(|b| *b == b'\n').next()?;
    Some(std::str::from_utf8(line).ok()?.strip_prefix("#!")?.to_string())
}

/// The files each program imports ([`imported_files`]), found once: a
/// spec's nodes run the same script with other arguments (a matrix of 200
/// `python3 train.py --seed N`), and reading its modules again for each made
/// validating them take four times as long.
#[derive(Debug, Default)]
pub struct Imports(std::collections::HashMap<PythonRun, Vec<String>>);

impl Imports {
    pub fn of(&mut self, spec_dir: &Path, run: &PythonRun) -> &[String] {
        self.0.entry(run.clone()).or_insert_with(|| imported_files(spec_dir, run))
    }
}

/// The files of `spec_dir` that Python imports, directly or through one
/// another, when it runs `run` (its files, or its `-c` code, with
/// `run.path0` first on its `sys.path`), leaving out `run`'s own files. A
/// file found is a regular file or a link (for the caller to refuse or pass
/// over, as it does for a script); a link is never read, and neither is a
/// file outside `spec_dir`.
pub(crate) fn imported_files(spec_dir: &Path, run: &PythonRun) -> Vec<String> {
    let mut seen: BTreeSet<String> = run.files.iter().cloned().collect();
    let mut todo: Vec<String> = run.files.clone();
    let mut code = run.code.clone();
    let mut found = Vec::new();
    'files: loop {
        let (source, here) = if let Some(code) = code.take() {
            (code, run.path0.clone())
        } else if let Some(file) = todo.pop() {
            let Some(source) = read_source(spec_dir, &file) else { continue };
            let here = parent_rel(&file).to_string();
            (source, here)
        } else {
            break;
        };
        for import in imports(&source) {
            for f in import.files(spec_dir, &run.path0, &here) {
                if seen.len() >= MAX_MODULES {
                    break 'files;
                }
                if seen.insert(f.clone()) {
                    found.push(f.clone());
                    todo.push(f);
                }
            }
        }
    }
    found.sort();
    found
}

/// A regular file's text (no link on the way, bounded), or nothing.
fn read_source(spec_dir: &Path, rel: &str) -> Option<String> {
    let file = crate::store::fsx::open_user_file(spec_dir, rel).ok()?;
    let bytes = crate::fsread::read_opened(file, MAX_SOURCE_BYTES).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// `rel` is there: a file, or a link (never followed).
pub(crate) fn there(spec_dir: &Path, rel: &str) -> bool {
    std::fs::symlink_metadata(spec_dir.join(rel)).is_ok_and(|m| m.is_file() || m.file_type().is_symlink())
}

fn is_dir(spec_dir: &Path, rel: &str) -> bool {
    std::fs::symlink_metadata(spec_dir.join(rel)).is_ok_and(|m| m.is_dir())
}

/// One import statement: `import a.b` (level 0, module `a.b`, no names),
/// `from ..a import b, c` (level 2, module `a`, names `b`, `c`).
#[derive(Debug, PartialEq)]
struct Import {
    level: usize,
    module: Vec<String>,
    names: Vec<String>,
}

impl Import {
    /// The files of the spec's folder this statement makes Python run, from
    /// a file in folder `here`: each package's `__init__.py` on the way, the
    /// module's file, and a name that is a submodule (`from pkg import mod`).
    /// Python's order: a folder with `__init__.py` (a package), else
    /// `NAME.py`, else a folder (a namespace package, with no file to run).
    fn files(&self, spec_dir: &Path, path0: &str, here: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = if self.level == 0 {
            path0.to_string()
        } else {
            // `.` is this file's package (its folder), `..` the one above.
            let mut at = here;
            for _ in 1..self.level {
                match at.rsplit_once('/') {
                    Some((up, _)) => at = up,
                    None if !at.is_empty() => at = "",
                    None => return out,
                }
            }
            at.to_string()
        };
        let join = |dir: &str, name: &str| {
            normalize_rel(&if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") })
        };
        for name in &self.module {
            let Some(path) = join(&at, name) else { return out };
            let init = format!("{path}/__init__.py");
            let module = format!("{path}.py");
            if there(spec_dir, &init) {
                out.push(init);
            } else if there(spec_dir, &module) {
                // A module: what follows its name is not a file.
                out.push(module);
                return out;
            } else if !is_dir(spec_dir, &path) {
                // Not of the spec's folder: installed, or no module at all.
                return out;
            }
            at = path;
        }
        // `from pkg import mod` runs `pkg/mod.py` where there is one.
        for name in &self.names {
            let Some(sub) = join(&at, name) else { continue };
            let (init, module) = (format!("{sub}/__init__.py"), format!("{sub}.py"));
            if there(spec_dir, &init) {
                out.push(init);
            } else if there(spec_dir, &module) {
                out.push(module);
            }
        }
        out
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Name(String),
    Dot,
    Comma,
    Star,
    Other,
}

/// The import statements of Python source. A statement ends at a newline
/// outside brackets (not after a `\`), at `;`, and at a `:` outside brackets
/// (`try: import x`); strings and comments are passed over.
fn imports(source: &str) -> Vec<Import> {
    statements(source).iter().flat_map(|s| imports_of(s)).collect()
}

fn statements(source: &str) -> Vec<Vec<Token>> {
    let chars: Vec<char> = source.chars().collect();
    let (mut out, mut statement, mut depth, mut i) = (Vec::new(), Vec::new(), 0usize, 0);
    let end = |statement: &mut Vec<Token>, out: &mut Vec<Vec<Token>>| {
        if !statement.is_empty() {
            out.push(std::mem::take(statement));
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '\\' => i += 1,
            '\n' | ';' if depth == 0 => end(&mut statement, &mut out),
            ':' if depth == 0 => end(&mut statement, &mut out),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            '\'' | '"' => {
                i = after_string(&chars, i);
                statement.push(Token::Other);
                continue;
            }
            '.' => statement.push(Token::Dot),
            ',' => statement.push(Token::Comma),
            '*' => statement.push(Token::Star),
            c if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // A string's prefix (`r"…"`, `f'…'`, `rb"…"`): the string follows.
                let prefix = word.len() <= 2 && word.chars().all(|p| "rRbBuUfFtT".contains(p));
                if prefix && i < chars.len() && (chars[i] == '\'' || chars[i] == '"') {
                    i = after_string(&chars, i);
                    statement.push(Token::Other);
                } else if word.starts_with(|d: char| d.is_ascii_digit()) {
                    statement.push(Token::Other);
                } else {
                    statement.push(Token::Name(word));
                }
                continue;
            }
            c if c.is_whitespace() => {}
            _ => statement.push(Token::Other),
        }
        i += 1;
    }
    end(&mut statement, &mut out);
    out
}

/// The index after the string that starts with the quote at `i` (one or
/// three quotes; a backslash keeps the next character in, raw or not).
fn after_string(chars: &[char], i: usize) -> usize {
    let q = chars[i];
    let triple = chars.get(i + 1) == Some(&q) && chars.get(i + 2) == Some(&q);
    let mut j = if triple { i + 3 } else { i + 1 };
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 2,
            c if c == q && (!triple || (chars.get(j + 1) == Some(&q) && chars.get(j + 2) == Some(&q))) => {
                return j + if triple { 3 } else { 1 };
            }
            // An unclosed one-line string ends at its line.
            '\n' if !triple => return j,
            _ => j += 1,
        }
    }
    j
}

/// The imports of one statement: `import a.b as c, d` imports `a.b` and
/// `d`; `from ..a import (b as x, c)` imports `b` and `c` from `..a`; `from
/// a import *` imports `a`. Anything else imports nothing.
fn imports_of(statement: &[Token]) -> Vec<Import> {
    let is = |t: Option<&Token>, word: &str| matches!(t, Some(Token::Name(n)) if n == word);
    if is(statement.first(), "import") {
        return statement[1..]
            .split(|t| *t == Token::Comma)
            .map_while(dotted_tokens)
            .map(|module| Import { level: 0, module, names: Vec::new() })
            .collect();
    }
    if !is(statement.first(), "from") {
        return Vec::new();
    }
    let rest = &statement[1..];
    let level = rest.iter().take_while(|t| **t == Token::Dot).count();
    let rest = &rest[level..];
    let Some(at) = rest.iter().position(|t| is(Some(t), "import")) else { return Vec::new() };
    let module = if at == 0 {
        Vec::new()
    } else {
        match dotted_tokens(&rest[..at]) {
            Some(m) => m,
            None => return Vec::new(),
        }
    };
    if level == 0 && module.is_empty() {
        return Vec::new();
    }
    // Each name is the first of its part (`b as x`); `*` and `(`…`)` name none.
    let names = rest[at + 1..]
        .split(|t| *t == Token::Comma)
        .filter_map(|part| match part.first() {
            Some(Token::Name(n)) => Some(n.clone()),
            _ => None,
        })
        .collect();
    vec![Import { level, module, names }]
}

/// The dotted name at the start of `tokens` (`a . b . c`, up to `as`).
fn dotted_tokens(tokens: &[Token]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut want_name = true;
    for t in tokens {
        match (t, want_name) {
            (Token::Name(n), true) => {
                out.push(n.clone());
                want_name = false;
            }
            (Token::Dot, false) => want_name = true,
            (Token::Name(n), false) if n == "as" => break,
            _ => return None,
        }
    }
    (!out.is_empty() && !want_name).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(source: &str) -> Vec<(usize, String, Vec<String>)> {
        imports(source).into_iter().map(|i| (i.level, i.module.join("."), i.names)).collect()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn import_statements_are_read_as_python_reads_them() {
        let source = r#"#!/usr/bin/env python3
"""A docstring that says
import not_this
"""
import os, model.layers as ml, utils
from .rel import a, b as c
from .. import up
from pkg.sub import (x,
    y)  # import not_this_either
from data import *
try: import optional
except ImportError: optional = None
if True: from cfg import load; import last
s = 'import no' + "from no import this" + f"{x!r} import no" + r'\' import no'
text = '''
import nor_this
'''
x = 1 \
    ; import continued
print(obj.import_, from_)
"#;
        assert_eq!(
            found(source),
            [
                (0, "os".into(), names(&[])),
                (0, "model.layers".into(), names(&[])),
                (0, "utils".into(), names(&[])),
                (1, "rel".into(), names(&["a", "b"])),
                (2, "".into(), names(&["up"])),
                (0, "pkg.sub".into(), names(&["x", "y"])),
                (0, "data".into(), names(&[])),
                (0, "optional".into(), names(&[])),
                (0, "cfg".into(), names(&["load"])),
                (0, "last".into(), names(&[])),
                (0, "continued".into(), names(&[])),
            ]
        );
    }

    fn tree(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            let (path, text) = f.split_once(':').unwrap_or((f, ""));
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text.replace('|', "\n")).unwrap();
        }
        dir
    }

    /// Python's `sys.path[0]` is the script's folder: `src/train.py`'s
    /// `import model` is `src/model.py`, and so for every module it imports.
    #[test]
    fn a_scripts_imports_are_found_from_its_folder_through_one_another() {
        let dir = tree(&[
            "src/train.py:import json, model|from utils.io import load|from pkg import sub, name",
            "src/model.py:from layers import dense",
            "src/layers.py:x = 1",
            "src/utils/__init__.py:",
            "src/utils/io.py:from .fmt import F|from . import other|from .. import model",
            "src/utils/fmt.py:",
            "src/utils/other/__init__.py:",
            "src/pkg/sub.py:",
            "src/unused.py:",
            "model.py:the spec's folder is not on sys.path for src/train.py",
        ]);
        assert_eq!(
            imported_files(dir.path(), &PythonRun::script("src/train.py".into(), "src".into())),
            [
                "src/layers.py",
                "src/model.py",
                "src/pkg/sub.py",
                "src/utils/__init__.py",
                "src/utils/fmt.py",
                "src/utils/io.py",
                "src/utils/other/__init__.py"
            ]
        );
        // `-m`: from the working folder; the module's package is its folder.
        let dir = tree(&[
            "tools/__init__.py:",
            "tools/gen.py:from tools.common import C|from .rel import R",
            "tools/common.py:",
            "tools/rel.py:",
        ]);
        assert_eq!(
            imported_files(
                dir.path(),
                &PythonRun {
                    files: vec!["tools/__init__.py".into(), "tools/gen.py".into()],
                    path0: String::new(),
                    code: None
                }
            ),
            ["tools/common.py", "tools/rel.py"]
        );
    }

    #[test]
    fn a_module_python_finds_elsewhere_or_behind_a_link_is_not_read() {
        // A package with `__init__.py` comes before `NAME.py`, which comes before a namespace folder.
        let dir = tree(&["t.py:import a, b, c.d, e.f", "a/__init__.py:", "a.py:", "b.py:", "b/x:", "c/d.py:", "e.py:"]);
        assert_eq!(
            imported_files(dir.path(), &PythonRun::script("t.py".into(), String::new())),
            ["a/__init__.py", "b.py", "c/d.py", "e.py"]
        );
        // A link is found (for the caller to refuse or pass over) and never read.
        let outside = tree(&["real.py:import secret"]);
        let dir = tree(&["t.py:import linked, os, ..up", "secret.py:"]);
        std::os::unix::fs::symlink(outside.path().join("real.py"), dir.path().join("linked.py")).unwrap();
        assert_eq!(imported_files(dir.path(), &PythonRun::script("t.py".into(), String::new())), ["linked.py"]);
        // A relative import above the spec's folder finds nothing.
        let dir = tree(&["t.py:from ... import x", "x.py:"]);
        assert_eq!(imported_files(dir.path(), &PythonRun::script("t.py".into(), String::new())), Vec::<String>::new());
    }
}
