//! The programs a shell command runs that may be files of the spec's folder:
//! the script an interpreter runs (`python3 train.py`, `bash tools/prep.sh`,
//! `Rscript fit.R`), a Python module (`python3 -m tools.gen`) and a program
//! given by path (`./score.sh`, `bin/tool`). The `shell` op keys them as it
//! keys its deps, so an edit of the code re-runs the node whether or not the
//! spec lists it (DVC and Snakemake re-run only for a declared script).
//!
//! Only the program's own position is read: an argument is data or a folder
//! the program writes (`--logdir runs`), which the spec says through deps and
//! outs. A word holding `$` (a variable, `${param:…}`) or a command
//! substitution names no file here. The words are split as `sh` splits them
//! (quotes, backslashes, `;`, `&`, `|`, parentheses, newlines, comments,
//! redirections and their targets); anything this does not recognise names
//! nothing, so a command is never refused for its syntax.

use std::path::Path;

use crate::reward::python::PythonRun;

/// What `cmd` runs and names ([`super::CommandReads`]), from one reading
/// of it. The programs: the candidates, relative to the spec's folder, each
/// normalized, in the order the command names them, and the Python ones
/// whose imports the DAG adds ([`crate::reward::python::Imports`]); a
/// candidate that is no file is for the caller to drop (a module's
/// `__init__.py` that is not there). The paths: see [`named_in`]. The shell
/// scripts it runs, whose commands [`Scripts`] reads.
pub(crate) fn command_reads(cmd: &str, spec_dir: &Path) -> super::CommandReads {
    command_reads_in(cmd, "", spec_dir)
}

/// [`command_reads`] of a command run in `folder`.
fn command_reads_in(cmd: &str, folder: &str, spec_dir: &Path) -> super::CommandReads {
    let mut found = Found::default();
    let mut named = Vec::new();
    for (folder, simple) in in_folders(cmd, Some(folder), spec_dir) {
        if let Some(folder) = &folder {
            program_of(&simple.words, folder, spec_dir, &mut found);
        }
        named_in(folder.as_deref(), simple, spec_dir, &mut named);
    }
    let mut programs = found.programs;
    programs.dedup();
    named.sort_unstable();
    named.dedup();
    super::CommandReads { programs, python: found.python, named, scripts: found.scripts }
}

/// The most shell scripts one command's are followed through, and the
/// largest script read: a folder of generated scripts is not walked
/// without end.
const MAX_SCRIPTS: usize = 256;
const MAX_SCRIPT_BYTES: u64 = 1 << 20;

/// What the shell scripts a command runs run, read once per compile for all
/// the nodes that run one (a matrix of `bash train.sh --seed N`), and added
/// to the command's own programs ([`Scripts::expand`]). A script is read as
/// a command is: its programs (`python3 train.py` in `tools/train.sh`) are
/// keyed, and the scripts it runs or sources (`. ./env.sh`) are read in
/// turn. A `cd` to a folder this cannot follow (`cd "$(dirname "$0")"`)
/// makes what follows it name nothing, as in a command.
///
/// The paths a script names are not the node's named paths (no edges, no
/// isolation reads): a script's branches (`case "$1" in prep) …;; train)
/// …;; esac`) are read all at once, and one run by two nodes would name each
/// node's outs for both, a cycle where there is none. A program more in a
/// key re-runs a node once more; a false edge refuses the spec.
#[derive(Debug, Default)]
pub struct Scripts(std::collections::HashMap<super::ShellScript, super::CommandReads>);

impl Scripts {
    pub fn expand(&mut self, spec_dir: &Path, mut reads: super::CommandReads) -> super::CommandReads {
        let mut queue: Vec<super::ShellScript> = std::mem::take(&mut reads.scripts);
        let mut seen: std::collections::HashSet<super::ShellScript> = queue.iter().cloned().collect();
        let mut at = 0;
        while at < queue.len() && at < MAX_SCRIPTS {
            let script = queue[at].clone();
            at += 1;
            let inner = self.0.entry(script.clone()).or_insert_with(|| {
                let file = crate::store::fsx::open_user_file(spec_dir, &script.file).ok();
                let text = file.and_then(|f| crate::fsread::read_opened(f, MAX_SCRIPT_BYTES).ok());
                let text = text.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
                command_reads_in(&text, &script.folder, spec_dir)
            });
            for p in &inner.programs {
                if !reads.programs.contains(p) {
                    reads.programs.push(p.clone());
                }
            }
            reads.python.extend(inner.python.iter().cloned());
            for s in &inner.scripts {
                if seen.insert(s.clone()) {
                    queue.push(s.clone());
                }
            }
        }
        reads
    }
}

/// The programs with what they import and what their scripts run, as the
/// DAG keys them.
#[cfg(test)]
fn shell_programs(cmd: &str, spec_dir: &Path) -> Vec<String> {
    let reads = Scripts::default().expand(spec_dir, command_reads(cmd, spec_dir));
    let mut imports = crate::reward::python::Imports::default();
    let mut out = reads.programs;
    for run in &reads.python {
        out.extend(imports.of(spec_dir, run).iter().filter(|f| !out.contains(f)).cloned().collect::<Vec<_>>());
    }
    out
}

#[cfg(test)]
fn named_paths(cmd: &str, spec_dir: &Path) -> Vec<String> {
    command_reads(cmd, spec_dir).named
}

/// What a command's programs are: their files, and for each Python program
/// the files it runs first with its `sys.path[0]` (the script's folder, or
/// the working folder for `-m`), whose imports are files of the program too.
#[derive(Default)]
struct Found {
    programs: Vec<String>,
    python: Vec<crate::reward::python::PythonRun>,
    scripts: Vec<super::ShellScript>,
}

/// The interpreters whose first operand is the script they run.
fn interpreter(word: &str) -> Option<Interpreter> {
    let name = word.rsplit('/').next().unwrap_or(word);
    let versioned =
        |stem: &str| name.strip_prefix(stem).is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit() || c == '.'));
    if versioned("python") || versioned("pypy") {
        Some(Interpreter::Python)
    } else if ["sh", "bash", "dash", "zsh", "ksh"].contains(&name) {
        Some(Interpreter::Shell)
    } else if ["Rscript", "julia", "node", "perl", "ruby"].contains(&name) || versioned("lua") {
        Some(Interpreter::Other)
    } else {
        None
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Interpreter {
    Python,
    Shell,
    Other,
}

/// Skips the words before the program: assignments (`OMP_NUM_THREADS=1`)
/// and the commands that run the command after them (`env`, `exec`, `time`,
/// `nohup`, `command`, `nice`, `timeout`, `uv run`, `poetry run`, `pipenv
/// run`), with their options.
fn skip_prefix(words: &[impl AsRef<str>]) -> usize {
    let word = |i: usize| words.get(i).map(AsRef::as_ref);
    let assignment = |w: &str| w.split_once('=').is_some_and(|(n, _)| !n.is_empty() && is_name(n));
    let mut i = 0;
    // Skips the options (of the command just skipped) from `i`; those in
    // `with_value` take the next word as their value.
    let skip_options = |mut i: usize, with_value: &[&str], assignments: bool| {
        while let Some(w) = word(i) {
            if !(w.starts_with('-') || assignments && assignment(w)) {
                break;
            }
            i += if with_value.contains(&w) { 2 } else { 1 };
        }
        i
    };
    loop {
        while word(i).is_some_and(assignment) {
            i += 1;
        }
        i = match word(i) {
            Some("env") => skip_options(i + 1, &["-u", "-C", "-S", "--unset", "--chdir", "--split-string"], true),
            Some("exec" | "time" | "nohup" | "command") => skip_options(i + 1, &["-a"], false),
            Some("nice") => skip_options(i + 1, &["-n", "--adjustment"], false),
            // Its options, then the duration.
            Some("timeout") => skip_options(i + 1, &["-s", "-k", "--signal", "--kill-after"], false) + 1,
            Some("uv" | "poetry" | "pipenv") if word(i + 1) == Some("run") => skip_options(i + 2, &[], false),
            _ => return i,
        };
    }
}

/// The program of one simple command run in `folder` (relative to the
/// spec's).
fn program_of(words: &[String], folder: &str, spec_dir: &Path, found: &mut Found) {
    let mut rest = words.iter().map(String::as_str).skip(skip_prefix(words));
    let Some(first) = rest.next() else { return };
    if expands(first) {
        return;
    }
    if first == "torchrun" || first == "deepspeed" || first == "accelerate" && rest.next() == Some("launch") {
        // A launcher's options take values as often as not: its script is
        // the first word naming a Python file.
        if let Some(script) = rest.find(|w| w.ends_with(".py") && !w.starts_with('-')) {
            script_at(script, Interpreter::Python, folder, spec_dir, found);
        }
        return;
    }
    if first == "source" || first == "." {
        // A script the shell reads itself, in the folder it is in.
        if let Some(script) = rest.next() {
            script_at(script, Interpreter::Shell, folder, spec_dir, found);
        }
        return;
    }
    let Some(kind) = interpreter(first) else {
        // A program given by path: one of the folder's files, or none; a
        // Python or shell script if its first line says so
        // (`#!/usr/bin/env python3`, `#!/bin/bash`).
        if let Some(rel) = path_at(folder, first).filter(|_| first.contains('/')) {
            if let Some(line) = crate::reward::python::shebang(spec_dir, &rel) {
                found.python.extend(PythonRun::of_shebang(&line, &rel));
                if line.split_whitespace().any(|w| interpreter(w) == Some(Interpreter::Shell)) {
                    found.scripts.push(super::ShellScript { file: rel.clone(), folder: folder.to_string() });
                }
            }
            found.programs.push(rel);
        }
        return;
    };
    // Options that take the next word as their value.
    let takes_value: &[&str] = match kind {
        Interpreter::Python => &["-W", "-X", "-Q"],
        Interpreter::Shell => &["-o", "+o", "-O", "+O"],
        // julia's, node's, ruby's and perl's (`-p` is inline code for some: below).
        Interpreter::Other => &["-t", "-J", "-C", "-L", "--threads", "-r", "--require", "--import", "--loader", "-I"],
    };
    // Options after which the code is inline: no script.
    let inline: &[&str] = match kind {
        Interpreter::Python | Interpreter::Shell => &["-c"],
        Interpreter::Other => &["-e", "-E", "--eval", "-p", "--print"],
    };
    while let Some(arg) = rest.next() {
        if expands(arg) {
            return;
        }
        if kind == Interpreter::Python {
            let module = match arg.strip_prefix("-m") {
                Some("") => rest.next(),
                Some(m) if !m.starts_with('-') => Some(m),
                _ => None,
            };
            if let Some(module) = module {
                // Found from the working folder, the first on its `sys.path`.
                let files: Vec<String> =
                    crate::reward::python_module_files(module).iter().filter_map(|f| path_at(folder, f)).collect();
                found.python.push(PythonRun { files: files.clone(), path0: folder.to_string(), code: None });
                found.programs.extend(files);
                return;
            }
        }
        if kind == Interpreter::Shell && arg == "-c" {
            // `bash -c 'python3 train.py'`: the programs of that command.
            if let Some(inner) = rest.next() {
                for (at, simple) in in_folders(inner, Some(folder), spec_dir) {
                    if let Some(at) = at {
                        program_of(&simple.words, &at, spec_dir, found);
                    }
                }
            }
            return;
        }
        if kind == Interpreter::Python && arg == "-c" {
            // `python3 -c 'from tools import gen; gen.main()'`: the code's imports.
            let code = rest.next().map(str::to_string);
            found.python.push(PythonRun { files: Vec::new(), path0: folder.to_string(), code });
            return;
        }
        if inline.contains(&arg) || arg == "-" {
            return;
        }
        if takes_value.contains(&arg) {
            rest.next();
            continue;
        }
        if arg == "--" {
            // The next word is the script, whatever it looks like.
            if let Some(script) = rest.next() {
                script_at(script, kind, folder, spec_dir, found);
            }
            return;
        }
        if arg.starts_with('-') || (kind == Interpreter::Shell && arg.starts_with('+')) {
            continue;
        }
        script_at(arg, kind, folder, spec_dir, found);
        return;
    }
}

fn script_at(word: &str, kind: Interpreter, folder: &str, spec_dir: &Path, found: &mut Found) {
    if expands(word) {
        return;
    }
    let Some(rel) = path_at(folder, word) else { return };
    if kind == Interpreter::Shell {
        found.scripts.push(super::ShellScript { file: rel.clone(), folder: folder.to_string() });
    }
    if kind != Interpreter::Python {
        found.programs.push(rel);
        return;
    }
    // Python runs a folder as its `__main__.py`, with the folder first on
    // its `sys.path`; a script, with the script's folder.
    let (script, path0) = if std::fs::symlink_metadata(spec_dir.join(&rel)).is_ok_and(|m| m.is_dir()) {
        (format!("{rel}/__main__.py"), rel)
    } else {
        let path0 = crate::store::fsx::parent_rel(&rel).to_string();
        (rel, path0)
    };
    found.python.push(PythonRun::script(script.clone(), path0));
    found.programs.push(script);
}

/// Whether a word is expanded by the shell (a variable, `${param:…}`, a
/// command substitution): it names no file here.
fn expands(word: &str) -> bool {
    word.bytes().any(|b| b == b'$' || b == b'`')
}

fn is_name(s: &str) -> bool {
    !s.starts_with(|c: char| c.is_ascii_digit()) && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Every path of the spec's folder a simple command run in `folder` names,
/// normalized and seen from that folder (`cd raw && cat te.jsonl` names
/// `raw/te.jsonl`; from a folder not known here, as from the spec's): each
/// word, an option's value after `=` (`--data=raw/te.jsonl`), each
/// redirection's file (`< raw/te.jsonl`), and the paths of an `sh -c '…'`
/// command. A word holding `$` names none.
fn named_in(folder: Option<&str>, simple: Simple, spec_dir: &Path, out: &mut Vec<String>) {
    let at = folder.unwrap_or("");
    let shell_c = simple.words.iter().any(|w| w == "-c")
        && simple.words.get(skip_prefix(&simple.words)).is_some_and(|w| interpreter(w) == Some(Interpreter::Shell));
    let inner = if shell_c {
        let rest = &simple.words[skip_prefix(&simple.words)..];
        rest.iter().position(|w| w == "-c").and_then(|at| rest.get(at + 1)).cloned()
    } else {
        None
    };
    for w in simple.words.into_iter().chain(simple.targets) {
        if expands(&w) {
            continue;
        }
        if let Some((_, value)) = w.split_once('=') {
            out.extend(path_at(at, value));
        }
        // Most words are already normal, and are kept as they are.
        if at.is_empty() && crate::store::fsx::is_normal_rel(&w) {
            out.push(w);
        } else {
            out.extend(path_at(at, &w));
        }
    }
    if let Some(inner) = inner {
        for (folder, simple) in in_folders(&inner, folder, spec_dir) {
            named_in(folder.as_deref(), simple, spec_dir, out);
        }
    }
}

/// The command split into simple commands, each a list of words as `sh`
/// reads them (quotes removed), without redirections and their targets.
#[cfg(test)]
fn simple_commands(cmd: &str) -> Vec<Vec<String>> {
    lex(cmd).into_iter().map(|c| c.words).filter(|w| !w.is_empty()).collect()
}

/// One simple command: its words, the files its redirections name, and how
/// many subshells (`(…)`) deep it is.
struct Simple {
    words: Vec<String>,
    targets: Vec<String>,
    depth: usize,
}

/// The simple commands of `cmd`.
fn lex(cmd: &str) -> Vec<Simple> {
    let mut commands = Vec::new();
    let mut current = Simple { words: Vec::new(), targets: Vec::new(), depth: 0 };
    let mut depth = 0usize;
    let mut word = String::new();
    // Whether `word` has started (an empty quoted word is a word).
    let mut started = false;
    // Whether the word being read is a redirection's target.
    let mut target = false;
    let mut chars = cmd.chars().peekable();
    let end_word = |current: &mut Simple, word: &mut String, started: &mut bool, target: &mut bool| {
        if *started {
            if *target {
                current.targets.push(std::mem::take(word));
            } else {
                current.words.push(std::mem::take(word));
            }
            *target = false;
        }
        *started = false;
    };
    let end_command = |commands: &mut Vec<Simple>, current: &mut Simple, depth: usize| {
        let next = Simple { words: Vec::new(), targets: Vec::new(), depth };
        commands.push(std::mem::replace(current, next));
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                match chars.next() {
                    Some('\n') | None => {}
                    Some(next) => word.push(next),
                }
                started = true;
            }
            '\'' => {
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
                started = true;
            }
            '"' => {
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$' | '`')) => {
                            word.extend(chars.next());
                        }
                        '\\' if chars.peek() == Some(&'\n') => {
                            chars.next();
                        }
                        // Still a `$` word: it names no file.
                        _ => word.push(q),
                    }
                }
                started = true;
            }
            '#' if !started => {
                for q in chars.by_ref() {
                    if q == '\n' {
                        break;
                    }
                }
                end_word(&mut current, &mut word, &mut started, &mut target);
                end_command(&mut commands, &mut current, depth);
            }
            ' ' | '\t' => end_word(&mut current, &mut word, &mut started, &mut target),
            ';' | '&' | '|' | '(' | ')' | '\n' | '{' | '}' if c != '{' && c != '}' || !started => {
                end_word(&mut current, &mut word, &mut started, &mut target);
                depth = match c {
                    '(' => depth + 1,
                    ')' => depth.saturating_sub(1),
                    _ => depth,
                };
                end_command(&mut commands, &mut current, depth);
            }
            '<' | '>' => {
                // `2>` and `2>&1`: the digits were the descriptor, not a word.
                if started && word.chars().all(|d| d.is_ascii_digit()) && !target {
                    word.clear();
                    started = false;
                } else {
                    end_word(&mut current, &mut word, &mut started, &mut target);
                }
                while matches!(chars.peek(), Some('>' | '<' | '&' | '|')) {
                    chars.next();
                }
                target = true;
            }
            '$' if chars.peek() == Some(&'(') => {
                // A command substitution: its words are part of this one,
                // which then names no file.
                word.push(c);
                let mut depth = 0;
                for q in chars.by_ref() {
                    word.push(q);
                    depth += match q {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        break;
                    }
                }
                started = true;
            }
            '`' => {
                word.push(c);
                for q in chars.by_ref() {
                    word.push(q);
                    if q == '`' {
                        break;
                    }
                }
                started = true;
            }
            _ => {
                word.push(c);
                started = true;
            }
        }
    }
    end_word(&mut current, &mut word, &mut started, &mut target);
    commands.push(current);
    // Empty ones stay: where one is, a subshell may have ended.
    commands
}

/// Each simple command of `cmd` with the folder it runs in, relative to
/// `cwd` (the folder `cmd` starts in, relative to the spec's): `cd sub &&
/// ./run.sh` runs `./run.sh` in `sub`, until the subshell the `cd` was made
/// in ends. `None`: a folder not known here (`cd $DIR`, `cd /abs`, `cd ~`,
/// `cd -`, `popd`, a folder outside the spec's or reached through a link).
fn in_folders(cmd: &str, cwd: Option<&str>, spec_dir: &Path) -> Vec<(Option<String>, Simple)> {
    // The folder at each subshell depth, the outermost first.
    let mut folders: Vec<Option<String>> = vec![cwd.map(str::to_string)];
    let mut out = Vec::new();
    for simple in lex(cmd) {
        // Leaving a subshell drops its folder; entering one starts from its parent's.
        let inherited = folders.last().cloned().flatten();
        folders.resize(simple.depth + 1, inherited);
        if simple.words.is_empty() && simple.targets.is_empty() {
            continue;
        }
        let folder = folders[simple.depth].clone();
        let first = simple.words.first().map(String::as_str);
        if matches!(first, Some("cd" | "pushd")) {
            let to = simple.words[1..].iter().find(|w| !w.starts_with('-') || *w == "-");
            folders[simple.depth] = match (folder.as_deref(), to) {
                (Some(at), Some(to)) if !to.contains(['$', '`', '~']) && to != "-" => {
                    join(at, to).filter(|rel| crate::store::fsx::link_on_path(spec_dir, rel).is_none())
                }
                _ => None,
            };
        } else if first == Some("popd") {
            folders[simple.depth] = None;
        }
        out.push((folder, simple));
    }
    out
}

/// `word` seen from folder `at` (both relative to the spec's folder),
/// normalized, if it is the spec's folder (`""`) or a path inside it.
fn join(at: &str, word: &str) -> Option<String> {
    if word.starts_with('/') {
        return None;
    }
    if at.is_empty() && crate::store::fsx::is_normal_rel(word) {
        return Some(word.to_string());
    }
    let mut parts: Vec<&str> = at.split('/').filter(|p| !p.is_empty()).collect();
    for seg in word.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

/// [`join`], for a path that must be a file or folder of the spec's folder
/// (not the folder itself).
fn path_at(at: &str, word: &str) -> Option<String> {
    join(at, word).filter(|rel| !rel.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs(cmd: &str) -> Vec<String> {
        shell_programs(cmd, Path::new("/nonexistent"))
    }

    #[test]
    fn the_words_are_split_as_sh_splits_them() {
        assert_eq!(
            simple_commands("a 'b c' \"d\\\"e\" f\\ g > out 2>&1 < in; h|i && j # k l\nm"),
            [vec!["a", "b c", "d\"e", "f g"], vec!["h"], vec!["i"], vec!["j"], vec!["m"]]
        );
        assert_eq!(simple_commands("x >>log y 2> err z"), [vec!["x", "y", "z"]]);
        assert_eq!(simple_commands("(cd sub && ./run.sh)"), [vec!["cd", "sub"], vec!["./run.sh"]]);
        assert_eq!(simple_commands("{ a; b; }"), [vec!["a"], vec!["b"]]);
        assert_eq!(simple_commands("echo a{b,c}d"), [vec!["echo", "a{b,c}d"]]);
        assert_eq!(simple_commands("'unclosed"), [vec!["unclosed"]]);
        assert_eq!(simple_commands("a $(b (c) d)/e f"), [vec!["a", "$(b (c) d)/e", "f"]]);
    }

    #[test]
    fn the_paths_a_command_names_are_its_words_values_and_redirections() {
        assert_eq!(
            named_paths(
                "python3 ./train.py --data=raw/te.jsonl -o 'out dir' < in.txt 2>&1 > /abs/x $HOME/y ../z",
                Path::new("/nonexistent")
            ),
            // (`1` is `2>&1`'s descriptor: a path nothing is at, which is no data.)
            ["--data=raw/te.jsonl", "-o", "1", "in.txt", "out dir", "python3", "raw/te.jsonl", "train.py"]
        );
        let named = |cmd: &str| named_paths(cmd, Path::new("/nonexistent"));
        assert!(named("bash -c 'python3 t.py --data raw/te.jsonl'").contains(&"raw/te.jsonl".to_string()));
        // Seen from the folder the command runs in.
        assert_eq!(named("cd raw && cat te.jsonl"), ["cd", "raw", "raw/cat", "raw/te.jsonl"]);
        assert!(named("(cd raw && cat a); cat ../b c").contains(&"c".to_string()));
        assert!(named("cd raw && bash -c 'cat te.jsonl'").contains(&"raw/te.jsonl".to_string()));
    }

    #[test]
    fn the_program_is_the_interpreters_script_or_a_path() {
        assert_eq!(programs("python3 train.py --lr 0.1 data/x.jsonl > out.txt"), ["train.py"]);
        assert_eq!(programs("OMP_NUM_THREADS=1 python3.11 -u -W ignore ./src/train.py"), ["src/train.py"]);
        assert_eq!(programs(".venv/bin/python train.py"), ["train.py"]);
        assert_eq!(programs("env A=1 -u B nohup time bash -e tools/prep.sh x"), ["tools/prep.sh"]);
        assert_eq!(programs("timeout -s KILL 60 nice -n 5 uv run --frozen python train.py"), ["train.py"]);
        assert_eq!(programs("torchrun --nproc_per_node 2 train.py --lr 1"), ["train.py"]);
        assert_eq!(programs("accelerate launch --num_processes 2 src/sft.py"), ["src/sft.py"]);
        assert_eq!(programs("./score.sh > d.txt; bin/tool --x"), ["score.sh", "bin/tool"]);
        assert_eq!(programs("Rscript fit.R && julia -t 4 run.jl"), ["fit.R", "run.jl"]);
        assert_eq!(programs("bash -c 'cd . && ./run.sh x'"), ["run.sh"]);
        assert_eq!(
            programs("python3 -m tools.gen"),
            ["tools/__init__.py", "tools/gen.py", "tools/gen/__init__.py", "tools/gen/__main__.py"]
        );
        assert_eq!(programs("python3 -mgen"), ["gen.py", "gen/__init__.py", "gen/__main__.py"]);
    }

    /// Before, `cd sub && ./run.sh` keyed `./run.sh` of the spec's folder
    /// (where there was one) and never `sub/run.sh`, the program that runs.
    #[test]
    fn a_program_is_found_in_the_folder_the_command_runs_in() {
        assert_eq!(programs("cd sub && ./run.sh"), ["sub/run.sh"]);
        assert_eq!(programs("cd sub; python3 train.py && cd ../b && bash x.sh"), ["sub/train.py", "b/x.sh"]);
        assert_eq!(programs("(cd sub && ./a.sh); ./b.sh"), ["sub/a.sh", "b.sh"], "a subshell's cd ends with it");
        assert_eq!(programs("(cd sub && ./a.sh); (./b.sh)"), ["sub/a.sh", "b.sh"], "the next subshell starts afresh");
        assert_eq!(programs("(cd sub; (./a.sh); ./b.sh)"), ["sub/a.sh", "sub/b.sh"]);
        assert_eq!(programs("cd sub && python3 ../train.py"), ["train.py"]);
        assert_eq!(programs("cd a/b && cd .. && ./x"), ["a/x"]);
        assert_eq!(programs("pushd sub && ./x && popd && ./y"), ["sub/x"]);
        assert_eq!(programs("cd sub && bash -c 'cd deeper && ./x'"), ["sub/deeper/x"]);
        assert_eq!(
            programs("cd sub && python3 -m tools.gen"),
            ["sub/tools/__init__.py", "sub/tools/gen.py", "sub/tools/gen/__init__.py", "sub/tools/gen/__main__.py"]
        );
        // A folder not known here: nothing it runs is a file of the spec's folder.
        for cmd in ["cd $DIR && ./x", "cd /abs && ./x", "cd && ./x", "cd ~/x && ./x", "cd .. && ./x", "cd - && ./x"] {
            assert_eq!(programs(cmd), Vec::<String>::new(), "{cmd}");
        }
    }

    /// A temporary folder holding `files` (path, text).
    fn folder_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (f, text) in files {
            std::fs::create_dir_all(dir.path().join(f).parent().unwrap()).unwrap();
            std::fs::write(dir.path().join(f), text).unwrap();
        }
        dir
    }

    /// A Python program is found by its imports however Python is started:
    /// a script given by path with a Python `#!` line, and `-c` code.
    #[test]
    fn a_python_program_by_path_or_inline_has_its_imports_found() {
        let dir = folder_with(&[
            ("bin/run", "#!/usr/bin/env python3\nimport helper\n"),
            ("bin/helper.py", ""),
            ("bin/tool", "#!/bin/sh\nimport helper\n"),
            ("tools/__init__.py", ""),
            ("tools/gen.py", "from . import common\n"),
            ("tools/common.py", ""),
        ]);
        assert_eq!(shell_programs("./bin/run x", dir.path()), ["bin/run", "bin/helper.py"]);
        assert_eq!(shell_programs("bin/tool", dir.path()), ["bin/tool"], "a shell script's words are no imports");
        assert_eq!(
            shell_programs("python3 -c 'from tools import gen; gen.main()' > o", dir.path()),
            ["tools/__init__.py", "tools/common.py", "tools/gen.py"]
        );
    }

    /// Before, `bash tools/train.sh` keyed `tools/train.sh` alone, not the
    /// `python3 train.py` it runs: an edit of `train.py` re-ran nothing.
    #[test]
    fn what_a_shell_script_runs_or_sources_is_the_commands_program_too() {
        let dir = folder_with(&[
            ("tools/train.sh", "#!/bin/bash\nset -e\n. ./env.sh\ncd sub && python3 run.py --data ../raw/te.json\n"),
            ("env.sh", "export A=1\nbash tools/inner.sh\nsource env.sh\n"),
            ("tools/inner.sh", "./bin/x\n"),
            ("sub/run.py", "import helper\n"),
            ("sub/helper.py", ""),
            ("bin/x", ""),
            ("launch", "#!/usr/bin/env sh\npython3 train.py\n"),
            ("train.py", ""),
        ]);
        assert_eq!(
            shell_programs("bash tools/train.sh --seed 1 > o.txt", dir.path()),
            ["tools/train.sh", "env.sh", "sub/run.py", "tools/inner.sh", "bin/x", "sub/helper.py"]
        );
        assert_eq!(shell_programs("./launch", dir.path()), ["launch", "train.py"]);
        // What a script names is not the node's (a script's branches are read all at once).
        assert!(!named_paths("bash tools/train.sh", dir.path()).iter().any(|p| p.contains("te.json")));
    }

    #[test]
    fn a_cd_through_a_link_is_a_folder_not_known_here() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("away")).unwrap();
        std::fs::create_dir(dir.path().join("here")).unwrap();
        assert_eq!(shell_programs("cd away && ./x; cd ../here && ./y", dir.path()), Vec::<String>::new());
        assert_eq!(shell_programs("cd here && ./y", dir.path()), ["here/y"]);
    }

    #[test]
    fn nothing_else_a_command_names_is_a_program() {
        for cmd in [
            "cat d/a.txt > d/b.txt",
            "python3 -c 'import x' train.py",
            "python3 $SCRIPT",
            "python3 ${param:script}",
            "$(which python3) train.py",
            "python3 $(dirname x)/run.py",
            "`which python3` train.py",
            "uv pip install x",
            "python3 /abs/train.py",
            "python3 ../outside.py",
            "python3 < train.py",
            "node -e 'x' app.js",
            "echo python3 train.py",
            "python3",
        ] {
            assert_eq!(programs(cmd), Vec::<String>::new(), "{cmd}");
        }
    }
}
