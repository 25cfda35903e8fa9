//! Helpers for tests that run the `orchestrate` binary in a temp dir.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_orchestrate")
}

/// A temp project folder with its own workspace.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Self {
        Project { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args).current_dir(self.path());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("orchestrate runs")
    }

    /// `orchestrate ARGS` run to its end, or killed and failed after `secs`:
    /// for a command that must not wait (on a FIFO, a lock) forever.
    pub fn run_within(&self, args: &[&str], secs: u64) -> Output {
        let child = self
            .cmd(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("orchestrate starts");
        output_within(child, secs, &format!("{args:?}"))
    }

    /// Waits until the file `rel` exists (a command's marker that it has
    /// started), failing the test naming `what` after `secs`.
    pub fn wait_for(&self, rel: &str, secs: u64, what: &str) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while !self.path().join(rel).exists() {
            assert!(std::time::Instant::now() < until, "{what}: no {rel} after {secs} s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// `orchestrate run --json ARGS`, asserting the exit code; returns the events.
    pub fn run_json(&self, args: &[&str], expect_code: i32) -> Vec<Value> {
        let mut full = vec!["run", "--json"];
        full.extend_from_slice(args);
        let out = self.run(&full);
        assert_eq!(
            out.status.code(),
            Some(expect_code),
            "orchestrate {full:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        events(&out)
    }
}

/// Says that the calling test is skipped (`what`, and why) on stderr itself,
/// past the harness's capture, as `SKIPPED: ...`: scripts/test.sh counts
/// these lines as skipped in its closing line, never as passed. The caller
/// returns right after.
/// A spawned command's output once it ends, or the command killed and the
/// test failed naming `what` after `secs`: for a run that must not wait for ever.
pub fn output_within(mut child: std::process::Child, secs: u64, what: &str) -> Output {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > until {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{what} still waited after {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

pub fn skip(what: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {what} ({why})");
}

pub fn events(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON event: {l}: {e}")))
        .collect()
}

/// Ids of the nodes with events of this type, sorted.
pub fn nodes_with(events: &[Value], kind: &str) -> Vec<String> {
    let mut v: Vec<String> = events
        .iter()
        .filter(|e| e["event"] == kind)
        .map(|e| e["node"].as_str().unwrap_or_default().to_string())
        .collect();
    v.sort();
    v
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A chain a → b → c plus an independent d, each writing a file.
pub const CHAIN: &str = r#"
name: chain
nodes:
  a:
    op: shell
    params:
      cmd: echo alpha > a.txt
      outs: [a.txt]
  b:
    op: shell
    params:
      cmd: tr a-z A-Z < a.txt > b.txt
      deps: [a.txt]
      outs: [b.txt]
  c:
    op: shell
    params:
      cmd: cat b.txt b.txt > c.txt
      deps: [b.txt]
      outs: [c.txt]
  d:
    op: shell
    params:
      cmd: echo delta > d.txt
      outs: [d.txt]
"#;

/// A spec named `name` with the tiny data, tokenizer and model (`data`,
/// `tokenizer`, `base`) that GRPO tests build on, followed by `nodes` (YAML
/// lines indented by two spaces).
pub fn tiny_spec(name: &str, nodes: &str) -> String {
    format!(
        "name: {name}
nodes:
  data:
    op: dataset.stock_arithmetic
    params: {{seed: 0, train: 60, validation: 8, test_id50: 4, test_ood100: 4, warmstart: 8}}
  tokenizer:
    op: tokenizer.build
    inputs: {{pages: 'data:pages.train', labels: 'data:labels.train'}}
    params: {{vocab_size: 400}}
  base:
    op: model.init
    inputs: {{tokenizer: 'tokenizer:tokenizer'}}
    params: {{seed: 0, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2}}
{nodes}"
    )
}

/// (Issue #31.) A fake TRL-like trainer: `output_dir/checkpoint-N/…`, `metrics.json` (nested)
/// and a `log.jsonl` of steps.
pub const TRAINER: &str = r#"import json, os, sys
lr, seed, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
scale = float(os.environ.get("SCALE", "1"))
for step in (1, 2):
    os.makedirs(f"{out}/checkpoint-{step}", exist_ok=True)
    open(f"{out}/checkpoint-{step}/model.safetensors", "wb").write(bytes([seed, step]) * 64)
with open(f"{out}/log.jsonl", "w") as log:
    for step in (1, 2):
        log.write(json.dumps({"step": step, "loss": 1.0 / (step + lr)}) + "\n")
mse = round(scale * (0.02 - 0.01 * lr) + 0.001 * seed, 8)
json.dump({"test_mse": mse, "eval": {"acc": 0.5 + lr, "status": "ok"}}, open(f"{out}/metrics.json", "w"))
"#;

pub const TRL_SWEEP: &str = r#"name: trl
nodes:
  train:
    op: shell
    matrix: {env.LR: [0.1, 0.2, 0.3], env.SEED: [0, 1]}
    params:
      cmd: python3 train.py "$LR" "$SEED" "runs/$LR-$SEED"
      deps: [train.py]
      outs: ['runs/${matrix.env.LR}-${matrix.env.SEED}']
      metrics: ['runs/${matrix.env.LR}-${matrix.env.SEED}/metrics.json']
      series: ['runs/${matrix.env.LR}-${matrix.env.SEED}/log.jsonl']
      env: {SCALE: 1}
"#;

/// Makes a FIFO at `path` (a file someone planted where ours or theirs
/// should be: opening it for reading waits for a writer, forever).
pub fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path the test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Makes the stored object at `path` (a file, or every file of a folder)
/// say `bytes`, as bit rot or an edit after a chmod would.
pub fn damage_object(path: &std::path::Path, bytes: &str) {
    use std::os::unix::fs::PermissionsExt;
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::read_dir(path).unwrap().map(|e| e.unwrap().path()).collect()
    } else {
        vec![path.to_path_buf()]
    };
    for f in files {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&f, bytes).unwrap();
    }
}

/// Every path under `root` (a folder as `NAME/`, a file with its bytes), links followed.
pub fn tree_of(root: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
                out.insert(format!("{rel}/"), Vec::new());
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}
