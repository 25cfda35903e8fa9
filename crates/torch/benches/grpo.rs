//! GRPO iteration benchmark: prints figures, asserts nothing (run: `cargo bench --bench grpo`).
//! Seconds per iteration by cost category, ours and PyTorch eager on the same
//! model config, shapes and batch, in the same run, and their ratio.

use std::process::Command;

fn main() {
    let worker = Command::new(env!("CARGO_BIN_EXE_orchestrate-torch"))
        .args(["bench-grpo", "--iterations", "4"])
        .output()
        .expect("worker runs");
    assert!(worker.status.success(), "{}", String::from_utf8_lossy(&worker.stderr));
    let ours: serde_json::Value = serde_json::from_slice(&worker.stdout).expect("JSON");
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON: source .setup/env.sh");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/grpo_iteration.py");
    let out = Command::new(python).args([script, "tiny", "96", "4"]).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last = out.stdout.rsplit(|b| *b == b'\n').find(|l| !l.is_empty()).expect("output");
    let theirs: serde_json::Value = serde_json::from_slice(last).expect("JSON");
    println!("tiny model, 4 prompts x 4 responses x 64 tokens, prompts of 96 tokens, 2 updates (mean of 3 iterations after a warm-up)");
    println!("{:<30} {:>12} {:>14} {:>8}", "cost", "ours (s)", "pytorch (s)", "ratio");
    for k in ["generation", "behavior_verification", "optimization_with_reference", "state_hashing", "loop"] {
        let a = ours["seconds_per_iteration"][k].as_f64().unwrap_or(f64::NAN);
        let b = theirs["seconds_per_iteration"][k].as_f64().unwrap_or(f64::NAN);
        println!("{k:<30} {a:>12.4} {b:>14.4} {:>8.2}", a / b);
    }
    println!(
        "ratio = ours / PyTorch eager (target for the whole loop <= 1.0); peak RSS ours: {} MB",
        ours["peak_rss_bytes"].as_u64().unwrap_or(0) / (1 << 20)
    );
}
