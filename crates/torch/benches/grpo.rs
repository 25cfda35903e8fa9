//! GRPO iteration benchmark: prints figures, asserts nothing.
//! Seconds per iteration by cost category, ours and PyTorch eager on the same
//! model config, shapes and batch, in the same run, and their ratio, with both
//! sides' peak memory.
//!
//! `cargo bench --bench grpo` (the tiny model, 4 iterations), or
//! `cargo bench --bench grpo -- qwen2.5-0.5b 3 1` (Qwen2.5-0.5B's exact shapes,
//! one group per forward/backward pass: minutes per iteration on a CPU; the whole
//! batch in one pass needs more than 24 GB). Arguments: preset, iterations (the
//! first is a warm-up), groups per pass (0: the whole batch). Both sides use the
//! same number of CPU threads: `ORCHESTRATE_THREADS`, else every core.

use std::process::Command;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let preset = args.first().cloned().unwrap_or_else(|| "tiny".into());
    let iterations: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4);
    let micro: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let threads = std::env::var("ORCHESTRATE_THREADS")
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let worker = Command::new(env!("CARGO_BIN_EXE_orchestrate-torch"))
        .args(["bench-grpo", "--preset", &preset, "--iterations", &iterations.to_string()])
        .args(["--micro-groups", &micro.to_string()])
        .env("ORCHESTRATE_THREADS", threads.to_string())
        .output()
        .expect("worker runs");
    assert!(worker.status.success(), "{}", String::from_utf8_lossy(&worker.stderr));
    let ours: serde_json::Value = serde_json::from_slice(&worker.stdout).expect("JSON");
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON: source .setup/env.sh");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/grpo_iteration.py");
    let out = Command::new(python)
        .args([script, &preset, "96", &iterations.to_string(), &threads.to_string(), "cpu", &micro.to_string()])
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last = out.stdout.rsplit(|b| *b == b'\n').find(|l| !l.is_empty()).expect("output");
    let theirs: serde_json::Value = serde_json::from_slice(last).expect("JSON");
    println!(
        "{preset}, 4 prompts x 4 responses x 64 tokens, prompts of 96 tokens, 2 updates, exact KL (ours in 4,096-wide \
         vocabulary blocks), {}, mean of {} iterations after a warm-up, {} / {} CPU threads (ours / PyTorch)",
        if micro == 0 { "the whole batch per pass".to_string() } else { format!("{micro} group(s) per pass") },
        iterations.max(2) - 1,
        ours["threads"],
        theirs["threads"]
    );
    println!("{:<30} {:>12} {:>14} {:>8}", "cost", "ours (s)", "pytorch (s)", "ratio");
    for k in ["generation", "behavior_verification", "optimization_with_reference", "state_hashing", "loop"] {
        let a = ours["seconds_per_iteration"][k].as_f64().unwrap_or(f64::NAN);
        let b = theirs["seconds_per_iteration"][k].as_f64().unwrap_or(f64::NAN);
        println!("{k:<30} {a:>12.4} {b:>14.4} {:>8.2}", a / b);
    }
    let mb = |v: &serde_json::Value| {
        v["peak_rss_bytes"].as_u64().map_or("undefined".to_string(), |b| format!("{} MB", b >> 20))
    };
    println!(
        "ratio = ours / PyTorch eager (target for the whole loop <= 1.0); peak RSS ours {}, PyTorch {}",
        mb(&ours),
        mb(&theirs)
    );
}
