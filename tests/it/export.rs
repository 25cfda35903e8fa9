//! `orchestrate export tensorboard`: the event files read back by TensorBoard's
//! own reader (the `tensorboard` package in the project's venv), every scalar
//! compared with the run's metrics, recomputed here.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{stderr, stdout, tiny_spec, Project};
use serde_json::Value;

/// run folder → tag → [(step, value)], as TensorBoard reads them.
type Read = BTreeMap<String, BTreeMap<String, Vec<(i64, f64)>>>;

fn tensorboard_read(dir: &Path) -> Read {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let script = format!("{}/tests/python/tb_read.py", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(python).arg(script).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: BTreeMap<String, BTreeMap<String, Vec<(i64, f64)>>> = serde_json::from_slice(&out.stdout).unwrap();
    v
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// The scalars a GRPO metrics file and its node's recorded costs should
/// give, computed from their JSON.
fn expected_grpo(m: &Value, costs: &Value) -> BTreeMap<String, Vec<(i64, f64)>> {
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for h in m["history"].as_array().unwrap() {
        let step = h["iteration"].as_i64().unwrap();
        let cost = &costs["iterations"][step.to_string()];
        let mut put = |tag: &str, v: Option<f64>| {
            if let Some(v) = v {
                out.entry(tag.into()).or_default().push((step, v));
            }
        };
        let rewards: Vec<f64> = h["rewards"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
        let g = rewards.len() / h["prompts"].as_array().unwrap().len();
        let stds: Vec<f64> = rewards
            .chunks(g)
            .map(|c| {
                let m = mean(c).unwrap();
                (c.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (c.len() - 1) as f64).sqrt()
            })
            .collect();
        put("train/reward", Some(h["mean_reward"].as_f64().unwrap()));
        put("train/reward_std", mean(&stds));
        put("train/frac_reward_zero_std", Some(h["zero_variance_fraction"].as_f64().unwrap()));
        let updates = h["updates"].as_array().unwrap();
        for (tag, field) in [
            ("train/loss", "loss"),
            ("train/kl", "kl"),
            ("train/clip_ratio", "clip_fraction"),
            ("train/grad_norm", "grad_norm"),
            ("train/learning_rate", "lr"),
        ] {
            put(tag, mean(&updates.iter().map(|u| u[field].as_f64().unwrap()).collect::<Vec<_>>()));
        }
        let lengths: Vec<f64> = h["response_tokens"].as_array().unwrap().iter().map(|n| n.as_f64().unwrap()).collect();
        put("train/completions/mean_length", mean(&lengths));
        let (eos, length) = (h["finish"]["eos"].as_f64().unwrap(), h["finish"]["length"].as_f64().unwrap());
        put("train/completions/clipped_ratio", Some(length / (eos + length)));
        put("orchestrate/behavior_max_gap", Some(h["behavior_max_gap"].as_f64().unwrap()));
        put("orchestrate/refused_batch", Some(if h["guard"]["decision"] == "allow" { 0.0 } else { 1.0 }));
        put("orchestrate/loop_seconds", Some(cost["loop_seconds"].as_f64().unwrap()));
        put("orchestrate/reward_seconds", cost["reward_seconds"].as_f64());
        // Each reward term under TRL's names (one term here: the verifier).
        for (name, t) in h["reward_terms"].as_object().unwrap() {
            put(&format!("train/rewards/{name}/mean"), t["mean"].as_f64());
            put(&format!("train/rewards/{name}/std"), t["std"].as_f64());
        }
    }
    out
}

fn expected_sft(m: &Value) -> BTreeMap<String, Vec<(i64, f64)>> {
    let mut out: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    let history = m["history"].as_array().unwrap();
    for u in history {
        let step = u["update"].as_i64().unwrap() + 1;
        for (tag, field) in [("train/loss", "loss"), ("train/learning_rate", "lr"), ("train/grad_norm", "grad_norm")] {
            out.entry(tag.into()).or_default().push((step, u[field].as_f64().unwrap()));
        }
    }
    for v in m["validation_history"].as_array().unwrap() {
        let last = history.iter().rfind(|u| u["epoch"] == v["epoch"]).unwrap();
        out.entry("eval/loss".into())
            .or_default()
            .push((last["update"].as_i64().unwrap() + 1, v["validation_nll"].as_f64().unwrap()));
    }
    out
}

fn same(read: &BTreeMap<String, Vec<(i64, f64)>>, expected: &BTreeMap<String, Vec<(i64, f64)>>, run: &str) {
    assert_eq!(read.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "{run}: tags");
    for (tag, points) in expected {
        let got = &read[tag];
        assert_eq!(got.len(), points.len(), "{run} {tag}");
        for ((s1, v1), (s2, v2)) in got.iter().zip(points) {
            assert_eq!(s1, s2, "{run} {tag}");
            // TensorBoard keeps scalars as 32-bit floats.
            assert_eq!(*v1 as f32, *v2 as f32, "{run} {tag} at step {s1}");
        }
    }
}

#[cfg(feature = "torch")]
#[test]
fn every_exported_scalar_reads_back_in_tensorboard_as_the_run_measured_it() {
    let p = Project::new();
    p.write(
        "t.yaml",
        &tiny_spec(
            "t",
            "  sft:
    op: train.sft
    inputs: {model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation'}
    params: {branch: warmstart, epochs: 2, batch_size: 16, lr: 1.0e-3}
  grpo:
    op: train.grpo
    inputs: {model: 'sft:model', pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {iterations: 3, max_new_tokens: 8, lr: 1.0e-4}
",
        ),
    );
    p.run_json(&["t.yaml"], 0);
    let out = p.run(&["export", "tensorboard", "t.yaml", "logs"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("grpo: ") && stdout(&out).contains("sft: "), "{}", stdout(&out));
    let read = tensorboard_read(&p.path().join("logs"));
    assert_eq!(read.keys().collect::<Vec<_>>(), ["grpo", "sft"]);
    let metrics = |node: &str| -> Value {
        let out = p.run(&["path", "t.yaml", &format!("{node}:metrics")]);
        serde_json::from_str(&std::fs::read_to_string(stdout(&out).trim()).unwrap()).unwrap()
    };
    // What each iteration cost is in the node's record (issue #34), as `status` shows it.
    let status: Value = serde_json::from_str(&stdout(&p.run(&["status", "--json"]))).unwrap();
    let costs = &status["nodes"].as_array().unwrap().iter().find(|n| n["node_id"] == "grpo").unwrap()["costs"];
    assert!(metrics("grpo")["history"][0].get("costs").is_none(), "no duration in a hashed output");
    same(&read["grpo"], &expected_grpo(&metrics("grpo"), costs), "grpo");
    same(&read["sft"], &expected_sft(&metrics("sft")), "sft");
    assert_eq!(read["grpo"]["train/reward"].len(), 3);

    // A second export into the same folder is refused before anything is written.
    let before = std::fs::read_dir(p.path().join("logs/grpo")).unwrap().count();
    let out = p.run(&["export", "tensorboard", "t.yaml", "logs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(p.path().join("logs/grpo")).unwrap().count(), before);
}

#[test]
fn the_committed_pack_exports_and_a_pack_without_response_lengths_leaves_that_curve_out() {
    let p = Project::new();
    let pack = format!("{}/artifacts/grpo-main-tiny/v0.2.0", env!("CARGO_MANIFEST_DIR"));
    let out = p.run(&["export", "tensorboard", &pack, "logs"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let read = tensorboard_read(&p.path().join("logs"));
    assert_eq!(read.len(), 11, "{:?}", read.keys());
    let grpo = &read["grpo@mode=continuous"];
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{pack}/outputs/grpo@mode=continuous/metrics")).unwrap())
            .unwrap();
    // v0.2.0 predates response_tokens: the curve is absent, not zeros.
    assert!(!grpo.contains_key("train/completions/mean_length"));
    let h = m["history"].as_array().unwrap();
    assert_eq!(grpo["train/reward"].len(), h.len());
    for ((step, v), it) in grpo["train/reward"].iter().zip(h) {
        assert_eq!(*step, it["iteration"].as_i64().unwrap());
        assert_eq!(*v as f32, it["mean_reward"].as_f64().unwrap() as f32);
    }
}

/// A shell node's series and metrics (#31): before, `export tensorboard`
/// refused a run without built-in training nodes. One run folder per node;
/// each logged step read back by TensorBoard as the trainer wrote it, each
/// metric once at the last step; a string metric is not written.
#[test]
fn a_shell_nodes_series_and_metrics_read_back_in_tensorboard() {
    let p = Project::new();
    p.write("train.py", common::TRAINER);
    p.write("s.yaml", common::TRL_SWEEP);
    assert_eq!(p.run(&["run", "s.yaml"]).status.code(), Some(0));
    let out = p.run(&["export", "tensorboard", "s.yaml", "logs"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let read = tensorboard_read(&p.path().join("logs"));
    assert_eq!(read.len(), 6, "{read:?}");
    for (lr, seed) in [(0.1, 0), (0.2, 1), (0.3, 0)] {
        let run = &read[&format!("train@env.LR={lr},env.SEED={seed}")];
        let loss = &run["loss"];
        assert_eq!(loss.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2]);
        for (step, value) in loss {
            let expect = 1.0 / (*step as f64 + lr);
            assert!((value - expect).abs() < 1e-6, "loss at {step}: {value} vs {expect}");
        }
        let m: Value = serde_json::from_str(&p.read(&format!("runs/{lr}-{seed}/metrics.json"))).unwrap();
        let mse = &run["metrics/test_mse"];
        assert_eq!(mse.len(), 1);
        assert_eq!(mse[0].0, 2);
        assert!((mse[0].1 - m["test_mse"].as_f64().unwrap()).abs() < 1e-7, "{mse:?}");
        assert!(!run.contains_key("metrics/eval.status"), "a string was written as a number");
    }
}
