//! Reward programs run for real: `python3` scripts written into a temporary
//! folder, each misbehaving in one way.

use super::*;
use crate::data::Split;
use std::time::Instant;

fn label(id: &str, answer: i64) -> LabelRow {
    LabelRow {
        id: id.into(),
        split: Split::Train,
        population: None,
        problem: serde_json::json!({"answer": answer}),
        target: Some(serde_json::json!(answer)),
        warmstart: false,
        reference_response: None,
        template: None,
    }
}

fn request(row: u64, text: &str) -> RewardRequest {
    RewardRequest {
        id: format!("p{row}"),
        row,
        label: label(&format!("p{row}"), 42),
        response: text.into(),
        finish: FinishReason::Eos,
        tokenization_valid: true,
    }
}

/// A program term running `body` (Python; `req` is each request) in a fresh folder.
fn program(body: &str) -> (tempfile::TempDir, RewardTerm) {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "import json, sys\nfor line in sys.stdin:\n    req = json.loads(line)\n{}\n",
        body.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
    );
    std::fs::write(dir.path().join("r.py"), script).unwrap();
    let term = RewardTerm {
        name: "mine".into(),
        weight: 0.5,
        verifier: None,
        command: Some(vec!["python3".into(), "r.py".into()]),
        files: vec![],
        timeout_s: Some(2.0),
    };
    (dir, term)
}

const ANSWER: &str = "ok = req['response'].strip() == str(req['label']['problem']['answer'])\n\
print(json.dumps({'reward': 1.0 if ok else 0.0, 'valid': True, 'reason': None if ok else 'wrong'}), flush=True)";

fn error_of(body: &str, text: &str) -> String {
    let (dir, term) = program(body);
    let mut f = RewardFunction::start(&[term], dir.path()).unwrap();
    let e = f.score(&request(7, text)).unwrap_err().to_string();
    assert!(e.contains("reward 'mine' (`python3 r.py`): row 7 (problem p7)"), "names the term, program and row: {e}");
    e
}

#[test]
fn a_program_and_a_verifier_are_summed_with_their_weights() {
    let (dir, term) = program(ANSWER);
    let terms = [RewardTerm { weight: 2.0, ..RewardTerm::of_verifier("gsm8k_last_number") }, term];
    let mut f = RewardFunction::start(&terms, dir.path()).unwrap();
    let right = f.score(&request(0, "42")).unwrap();
    assert_eq!(right.total, 2.0 * 1.0 + 0.5 * 1.0);
    assert_eq!(right.terms[1], TermScore { reward: 1.0, valid: true, reason: None });
    let wrong = f.score(&request(1, "41")).unwrap();
    assert_eq!(wrong.total, 0.0);
    assert_eq!(wrong.terms[1].reason.as_deref(), Some("wrong"));
    assert_eq!(f.name(), "reward:gsm8k_last_number+mine");
    let stats = term_stats(&f.names(), &[right, wrong]);
    assert_eq!(stats["mine"].mean, 0.5);
    assert!((stats["mine"].std.unwrap() - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12);
    f.finish().unwrap();
}

#[test]
fn the_reward_identity_follows_the_programs_file_and_the_weights() {
    let (dir, term) = program(ANSWER);
    let hash = |terms: &[RewardTerm]| RewardFunction::start(terms, dir.path()).unwrap().protocol_hash();
    let a = hash(std::slice::from_ref(&term));
    assert_eq!(a, hash(std::slice::from_ref(&term)), "stable");
    assert_ne!(a, hash(&[RewardTerm { weight: 0.25, ..term.clone() }]));
    std::fs::write(
        dir.path().join("r.py"),
        format!("{}\n# edited\n", std::fs::read_to_string(dir.path().join("r.py")).unwrap()),
    )
    .unwrap();
    assert_ne!(a, hash(std::slice::from_ref(&term)), "the script's content is in it");
    // A lone verifier keeps the verifier's own name and hash.
    let plain = RewardFunction::start(&[RewardTerm::of_verifier("gsm8k_last_number")], dir.path()).unwrap();
    let v = VerifierRegistry::builtin();
    assert_eq!(plain.name(), "gsm8k_last_number");
    assert!(v.is_registered(&plain.name(), &plain.protocol_hash()));
    let f = RewardFunction::start(&[term], dir.path()).unwrap();
    assert!(!v.is_registered(&f.name(), &f.protocol_hash()));
    assert!(f.registry().is_registered(&f.name(), &f.protocol_hash()));
}

#[test]
fn a_crash_names_the_exit_and_the_stderr() {
    let e = error_of("sys.stderr.write('boom: no module named sympy\\n'); sys.exit(3)", "42");
    assert!(e.contains("exited with code 3 without replying"), "{e}");
    assert!(e.contains("boom: no module named sympy"), "{e}");
}

#[test]
fn a_hang_is_killed_at_the_timeout() {
    let started = Instant::now();
    let e = error_of("import time; time.sleep(60)", "42");
    assert!(e.contains("no reply within 2 s"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "killed, not waited for");
}

#[test]
fn garbage_nan_and_a_missing_field_are_errors_not_zeros() {
    let e = error_of("print('the answer is 42', flush=True)", "42");
    assert!(e.contains("is not {\"reward\""), "{e}");
    assert!(e.contains("the reply: \"the answer is 42\""), "{e}");
    let e = error_of("print(json.dumps({'reward': float('nan'), 'valid': True}), flush=True)", "42");
    assert!(e.contains("not a finite number"), "{e}");
    let e = error_of("print(json.dumps({'reward': 1.0}), flush=True)", "42");
    assert!(e.contains("missing field `valid`"), "{e}");
    let e = error_of("print(json.dumps({'reward': '1', 'valid': True}), flush=True)", "42");
    assert!(e.contains("invalid type"), "{e}");
}

#[test]
fn a_gigabyte_on_stdout_is_cut_at_the_bound() {
    // 1 GiB without a newline, in 1 MiB writes: the reader stops at 64 KiB
    // and the program is killed long before it finishes.
    let started = Instant::now();
    let e = error_of(
        "chunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\nsys.stdout.flush()",
        "42",
    );
    assert!(e.contains("over 65536 bytes"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn what_a_program_leaves_running_dies_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let (d, term) = program(&format!(
        "import subprocess\np = subprocess.Popen(['sleep', '300'])\nopen({:?}, 'w').write(str(p.pid))\nprint(json.dumps({{'reward': 0.0, 'valid': True}}), flush=True)",
        pidfile.display().to_string()
    ));
    let mut f = RewardFunction::start(&[term], d.path()).unwrap();
    f.score(&request(0, "1")).unwrap();
    f.finish().unwrap();
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: signal 0 only checks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
    assert!(!alive, "the program's own child was killed with its group");
}

#[test]
fn bad_terms_are_refused_with_the_field() {
    let both = RewardTerm { command: Some(vec!["python3".into()]), ..RewardTerm::of_verifier("gsm8k_last_number") };
    assert!(check_terms(&[both]).unwrap_err().1.contains("exactly one of"));
    let typo = RewardTerm::of_verifier("gsm8k_last_numbr");
    let (path, m) = check_terms(&[typo]).unwrap_err();
    assert_eq!(path, ["0", "verifier"]);
    assert!(m.contains("did you mean 'gsm8k_last_number'"), "{m}");
    let (_d, t) = program(ANSWER);
    let outside = RewardTerm { files: vec!["../secret.py".into()], ..t.clone() };
    assert_eq!(check_terms(&[outside]).unwrap_err().0, ["0", "files"]);
    let twice = check_terms(&[t.clone(), t]).unwrap_err();
    assert!(twice.1.contains("names two terms"), "{}", twice.1);
}

#[test]
fn the_programs_files_are_its_script_and_what_it_declares() {
    let (dir, mut term) = program(ANSWER);
    std::fs::write(dir.path().join("table.csv"), "a\n").unwrap();
    term.files = vec!["./table.csv".into()];
    term.command.as_mut().unwrap().push("--strict".into());
    assert_eq!(program_files(&[term.clone()], dir.path()), ["r.py", "table.csv"]);
    assert_eq!(program_interpreters(&[term]), ["python3"]);
    assert!(interpreter_version("python3").unwrap().starts_with("Python 3"));
    assert!(interpreter_version("no-such-interpreter-here").unwrap_err().to_string().contains("cannot run"));
}

/// Before, `python3 -m rewards.judge` (Python's way to run a module of a
/// package) keyed none of the program's code: `rewards.judge` names no file,
/// so an edit of `rewards/judge.py` re-ran nothing and the cached rewards
/// stood for code that no longer existed. The module's file, and the
/// `__init__.py` of each package on its way, are its files now.
#[test]
fn a_python_module_run_with_dash_m_is_keyed_by_its_files() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["rewards/__init__.py", "rewards/judge.py", "rewards/util.py", "tools/cli/__main__.py", "table.csv"] {
        let path = dir.path().join(f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "x = 1\n").unwrap();
    }
    let files = |command: &[&str]| {
        let term = RewardTerm {
            command: Some(command.iter().map(|s| s.to_string()).collect()),
            ..RewardTerm::of_verifier("unused")
        };
        let term = RewardTerm { verifier: None, ..term };
        program_files(&[term], dir.path())
    };
    assert_eq!(
        files(&["python3", "-m", "rewards.judge", "table.csv"]),
        ["rewards/__init__.py", "rewards/judge.py", "table.csv"]
    );
    assert_eq!(files(&["python3", "-mrewards.judge"]), ["rewards/__init__.py", "rewards/judge.py"]);
    assert_eq!(files(&["python", "-u", "-m", "tools.cli"]), ["tools/cli/__main__.py"], "a package's __main__.py");
    // A folder run by Python (`python3 tools/cli`) is its `__main__.py`.
    assert_eq!(files(&["python3", "tools/cli", "table.csv"]), ["table.csv", "tools/cli/__main__.py"]);
    // A module not in the spec's folder (installed) adds nothing; nor does `-m` for another program.
    assert!(files(&["python3", "-m", "json.tool"]).is_empty());
    assert!(files(&["sort", "-m", "rewards.judge"]).is_empty());
}

/// Before, a reward program's own modules were in its key and identity only
/// when `files` listed them: an edit of the `rewards/util.py` that
/// `rewards/judge.py` imports left the rewards cached and the identity the
/// same. What the script imports from the spec's folder is found now.
#[test]
fn what_a_python_reward_program_imports_is_in_its_files_and_identity() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("rewards/lib")).unwrap();
    for (f, text) in [
        ("rewards/judge.py", "import json, sys\nfrom util import score\nimport lib.parse\n"),
        ("rewards/util.py", "def score(x): return 1.0\n"),
        ("rewards/lib/__init__.py", ""),
        ("rewards/lib/parse.py", "from . import grammar\n"),
        ("rewards/lib/grammar.py", "G = 1\n"),
    ] {
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    let term = RewardTerm {
        command: Some(vec!["python3".into(), "rewards/judge.py".into()]),
        ..RewardTerm { verifier: None, ..RewardTerm::of_verifier("unused") }
    };
    assert_eq!(
        program_files(std::slice::from_ref(&term), dir.path()),
        [
            "rewards/judge.py",
            "rewards/lib/__init__.py",
            "rewards/lib/grammar.py",
            "rewards/lib/parse.py",
            "rewards/util.py"
        ]
    );
    // Started by path with a Python `#!` line, or as `-c` code, alike.
    std::fs::write(dir.path().join("rewards/run"), "#!/usr/bin/python3 -u\nfrom util import score\n").unwrap();
    let by = |command: &[&str]| {
        let term = RewardTerm { command: Some(command.iter().map(|c| c.to_string()).collect()), ..term.clone() };
        program_files(&[term], dir.path())
    };
    assert_eq!(by(&["rewards/run"]), ["rewards/run", "rewards/util.py"]);
    assert_eq!(
        by(&["python3", "-c", "import rewards.util"]),
        ["rewards/util.py"],
        "from the working folder, the spec's (rewards/ has no __init__.py: a namespace package)"
    );
    let program = term.program().unwrap();
    let before = program.digest(dir.path()).unwrap();
    std::fs::write(dir.path().join("rewards/lib/grammar.py"), "G = 2\n").unwrap();
    assert_ne!(program.digest(dir.path()).unwrap(), before, "an imported module's edit changes the identity");
}

#[test]
fn a_script_behind_a_link_is_refused_not_left_out_of_the_key() {
    // `python3 r.py` where r.py is a link to a file outside the spec's folder:
    // left out of the files, its content would change nothing in the key.
    let (dir, term) = program(ANSWER);
    let outside = tempfile::tempdir().unwrap();
    std::fs::rename(dir.path().join("r.py"), outside.path().join("real.py")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("real.py"), dir.path().join("r.py")).unwrap();
    assert_eq!(
        program_files(std::slice::from_ref(&term), dir.path()),
        ["r.py"],
        "the linked script is still one of its files"
    );
    let e = term.program().unwrap().digest(dir.path()).unwrap_err().to_string();
    assert!(e.contains("r.py") && e.contains("link"), "the refusal names the link: {e}");
}
