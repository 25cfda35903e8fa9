//! Model benchmark: prints figures, asserts nothing (run: `cargo bench --bench model`).
//!
//! Tokens per second of 64-token greedy generation with and without the KV
//! cache, and teacher-forced scoring time, for our Qwen2 and for transformers
//! on the same config (random weights), the same batch, in the same run.
//! `ORCHESTRATE_BENCH_05B=1` adds Qwen2.5-0.5B's exact config (slow on CPU).

use std::process::Command;

use serde_json::Value;

fn worker(args: &[&str]) -> Value {
    let out =
        Command::new(env!("CARGO_BIN_EXE_orchestrate-torch")).arg("bench").args(args).output().expect("worker runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn transformers(preset: &str, batch: usize, prompt: usize, tokens: usize, no_cache: bool) -> Value {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON: source .setup/env.sh");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/hf_generate.py");
    let out = Command::new(python)
        .args([
            script,
            preset,
            &batch.to_string(),
            &prompt.to_string(),
            &tokens.to_string(),
            if no_cache { "1" } else { "0" },
        ])
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(out.stdout.rsplit(|b| *b == b'\n').find(|l| !l.is_empty()).unwrap()).expect("JSON")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn main() {
    let mut cases = vec![("tiny", 1usize, 32usize, 64usize, true), ("tiny", 8, 32, 64, true)];
    if std::env::var_os("ORCHESTRATE_BENCH_05B").is_some() {
        cases.push(("qwen2.5-0.5b", 1, 32, 64, true));
    }
    println!(
        "{:<14} {:>5} {:>12} {:>12} {:>8} {:>12} {:>12} {:>10} {:>10} {:>10}",
        "config",
        "batch",
        "ours kv t/s",
        "ours full",
        "kv gain",
        "hf kv t/s",
        "hf full",
        "gen ratio",
        "score ours",
        "score hf"
    );
    for (preset, batch, prompt, tokens, no_cache) in cases {
        let (b, p, t) = (batch.to_string(), prompt.to_string(), tokens.to_string());
        let mut args = vec!["--preset", preset, "--batch", &b, "--prompt-len", &p, "--new-tokens", &t];
        if no_cache {
            args.push("--no-cache");
        }
        let ours = worker(&args);
        let hf = transformers(preset, batch, prompt, tokens, no_cache);
        let (okv, ofull, hkv, hfull) = (
            f(&ours["kv_cache_tokens_per_s"]),
            f(&ours["no_cache_tokens_per_s"]),
            f(&hf["kv_cache_tokens_per_s"]),
            f(&hf["no_cache_tokens_per_s"]),
        );
        // Ratio of time: ours / transformers (<= 1.0 means we are no slower).
        println!(
            "{:<14} {:>5} {:>12.1} {:>12.1} {:>7.1}x {:>12.1} {:>12.1} {:>10.2} {:>9.3}s {:>9.3}s",
            preset,
            batch,
            okv,
            ofull,
            okv / ofull,
            hkv,
            hfull,
            hkv / okv,
            f(&ours["scoring_s"]),
            f(&hf["scoring_s"])
        );
    }
    println!("gen ratio = our time / transformers' time with the KV cache (target <= 1.0); kv gain = KV cache vs full recompute (target >= 5x at 64 tokens)");
}
