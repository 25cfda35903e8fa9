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
