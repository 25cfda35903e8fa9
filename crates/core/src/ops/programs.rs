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

/// The candidates, relative to the spec's folder, each normalized, in the
/// order the command names them. A candidate that is no file is for the
/// caller to drop (a module's `__init__.py` that is not there).
pub(crate) fn shell_programs(cmd: &str, spec_dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for words in simple_commands(cmd) {
        program_of(&words, spec_dir, &mut out);
    }
    out.dedup();
    out
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
fn skip_prefix(words: &[&str]) -> usize {
    let assignment = |w: &str| w.split_once('=').is_some_and(|(n, _)| !n.is_empty() && is_name(n));
    let mut i = 0;
    // Skips the options (of the command just skipped) from `i`; those in
    // `with_value` take the next word as their value.
    let skip_options = |mut i: usize, with_value: &[&str], assignments: bool| {
        while let Some(w) = words.get(i).copied() {
            if !(w.starts_with('-') || assignments && assignment(w)) {
                break;
            }
            i += if with_value.contains(&w) { 2 } else { 1 };
        }
        i
    };
    loop {
        while words.get(i).is_some_and(|w| assignment(w)) {
            i += 1;
        }
        i = match words.get(i).copied() {
            Some("env") => skip_options(i + 1, &["-u", "-C", "-S", "--unset", "--chdir", "--split-string"], true),
            Some("exec" | "time" | "nohup" | "command") => skip_options(i + 1, &["-a"], false),
            Some("nice") => skip_options(i + 1, &["-n", "--adjustment"], false),
            // Its options, then the duration.
            Some("timeout") => skip_options(i + 1, &["-s", "-k", "--signal", "--kill-after"], false) + 1,
            Some("uv" | "poetry" | "pipenv") if words.get(i + 1) == Some(&"run") => skip_options(i + 2, &[], false),
            _ => return i,
        };
    }
}

fn program_of(words: &[String], spec_dir: &Path, out: &mut Vec<String>) {
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let mut rest = words.iter().copied().skip(skip_prefix(&words));
    let Some(first) = rest.next() else { return };
    if first.contains('$') || first.contains('`') {
        return;
    }
    if first == "torchrun" || first == "deepspeed" || first == "accelerate" && rest.next() == Some("launch") {
        // A launcher's options take values as often as not: its script is
        // the first word naming a Python file.
        if let Some(script) = rest.find(|w| w.ends_with(".py") && !w.starts_with('-')) {
            script_at(script, Interpreter::Python, spec_dir, out);
        }
        return;
    }
    let Some(kind) = interpreter(first) else {
        // A program given by path: one of the folder's files, or none.
        if first.contains('/') {
            out.extend(crate::store::fsx::normalize_rel(first));
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
        if arg.contains('$') || arg.contains('`') {
            return;
        }
        if kind == Interpreter::Python {
            let module = match arg.strip_prefix("-m") {
                Some("") => rest.next(),
                Some(m) if !m.starts_with('-') => Some(m),
                _ => None,
            };
            if let Some(module) = module {
                out.extend(crate::reward::python_module_files(module));
                return;
            }
        }
        if kind == Interpreter::Shell && arg == "-c" {
            // `bash -c 'python3 train.py'`: the programs of that command.
            if let Some(inner) = rest.next() {
                for words in simple_commands(inner) {
                    program_of(&words, spec_dir, out);
                }
            }
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
                script_at(script, kind, spec_dir, out);
            }
            return;
        }
        if arg.starts_with('-') || (kind == Interpreter::Shell && arg.starts_with('+')) {
            continue;
        }
        script_at(arg, kind, spec_dir, out);
        return;
    }
}

fn script_at(word: &str, kind: Interpreter, spec_dir: &Path, out: &mut Vec<String>) {
    if word.contains('$') || word.contains('`') {
        return;
    }
    let Some(rel) = crate::store::fsx::normalize_rel(word) else { return };
    // Python runs a folder as its `__main__.py`.
    if kind == Interpreter::Python && std::fs::symlink_metadata(spec_dir.join(&rel)).is_ok_and(|m| m.is_dir()) {
        out.push(format!("{rel}/__main__.py"));
        return;
    }
    out.push(rel);
}

fn is_name(s: &str) -> bool {
    !s.starts_with(|c: char| c.is_ascii_digit()) && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Every path of the spec's folder a shell command names, normalized: each
/// word, an option's value after `=` (`--data=raw/te.jsonl`), and each
/// redirection's file (`< raw/te.jsonl`). A word holding `$` names none.
/// Isolation reads these as data the command reads.
pub(crate) fn named_paths(cmd: &str) -> Vec<String> {
    let (commands, targets) = lex(cmd);
    let mut out: Vec<String> = commands
        .iter()
        .flatten()
        .chain(&targets)
        .filter(|w| !w.contains('$') && !w.contains('`'))
        .flat_map(|w| [Some(w.as_str()), w.split_once('=').map(|(_, v)| v)])
        .flatten()
        .filter_map(crate::store::fsx::normalize_rel)
        .collect();
    // `bash -c '… raw/te.jsonl'`: the paths of that command too.
    for words in &commands {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let rest = &words[skip_prefix(&words)..];
        if rest.first().and_then(|w| interpreter(w)) == Some(Interpreter::Shell) {
            if let Some(at) = rest.iter().position(|w| *w == "-c") {
                out.extend(rest.get(at + 1).map(|inner| named_paths(inner)).unwrap_or_default());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The command split into simple commands, each a list of words as `sh`
/// reads them (quotes removed), without redirections and their targets.
fn simple_commands(cmd: &str) -> Vec<Vec<String>> {
    lex(cmd).0
}

/// The simple commands of `cmd`, and the files its redirections name.
fn lex(cmd: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let mut targets = Vec::new();
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    // Whether `word` has started (an empty quoted word is a word).
    let mut started = false;
    // Whether the word being read is a redirection's target (dropped).
    let mut target = false;
    let mut chars = cmd.chars().peekable();
    let mut end_word = |words: &mut Vec<String>, word: &mut String, started: &mut bool, target: &mut bool| {
        if *started {
            if *target {
                targets.push(std::mem::take(word));
            } else {
                words.push(std::mem::take(word));
            }
            *target = false;
        }
        *started = false;
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
                end_word(&mut words, &mut word, &mut started, &mut target);
                commands.push(std::mem::take(&mut words));
            }
            ' ' | '\t' => end_word(&mut words, &mut word, &mut started, &mut target),
            ';' | '&' | '|' | '(' | ')' | '\n' | '{' | '}' if c != '{' && c != '}' || !started => {
                end_word(&mut words, &mut word, &mut started, &mut target);
                commands.push(std::mem::take(&mut words));
            }
            '<' | '>' => {
                // `2>` and `2>&1`: the digits were the descriptor, not a word.
                if started && word.chars().all(|d| d.is_ascii_digit()) && !target {
                    word.clear();
                    started = false;
                } else {
                    end_word(&mut words, &mut word, &mut started, &mut target);
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
    end_word(&mut words, &mut word, &mut started, &mut target);
    commands.push(words);
    commands.retain(|c| !c.is_empty());
    (commands, targets)
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
            named_paths("python3 ./train.py --data=raw/te.jsonl -o 'out dir' < in.txt 2>&1 > /abs/x $HOME/y ../z"),
            // (`1` is `2>&1`'s descriptor: a path nothing is at, which is no data.)
            ["--data=raw/te.jsonl", "-o", "1", "in.txt", "out dir", "python3", "raw/te.jsonl", "train.py"]
        );
        assert!(named_paths("bash -c 'python3 t.py --data raw/te.jsonl'").contains(&"raw/te.jsonl".to_string()));
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
