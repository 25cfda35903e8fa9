//! Engine benchmark: prints figures, asserts nothing (run: `cargo bench --bench engine`).
//!
//! 1. A 200-stage shell pipeline (10 layers × 20 stages; each stage writes a
//!    small file from its parent's): first-run wall time and no-op re-run time.
//! 2. `orchestrate plan` on a spec of 10,000 synthetic nodes (100 layers × 100),
//!    in a fresh workspace and, optionally, with all of them cached
//!    (`ORCHESTRATE_BENCH_FULL=1`: runs the 10,000 nodes first, ~1 min).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn pipeline(layers: usize, width: usize) -> String {
    let mut yaml = format!("name: bench-{layers}x{width}\nnodes:\n");
    for l in 0..layers {
        for s in 0..width {
            let out = format!("d/l{l}s{s}.txt");
            if l == 0 {
                yaml.push_str(&format!(
                    "  l{l}s{s}:\n    op: shell\n    params: {{cmd: 'echo {s} > {out}', outs: [{out}]}}\n"
                ));
            } else {
                let dep = format!("d/l{}s{s}.txt", l - 1);
                yaml.push_str(&format!(
                    "  l{l}s{s}:\n    op: shell\n    params: {{cmd: 'cat {dep} > {out}; echo {l} >> {out}', deps: [{dep}], outs: [{out}]}}\n"
                ));
            }
        }
    }
    yaml
}

fn orchestrate(dir: &Path, args: &[&str]) -> f64 {
    let start = Instant::now();
    let out =
        Command::new(env!("CARGO_BIN_EXE_orchestrate")).args(args).current_dir(dir).output().expect("orchestrate runs");
    let secs = start.elapsed().as_secs_f64();
    assert!(out.status.success(), "orchestrate {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes --bench; nothing else is accepted.
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("p.yaml"), pipeline(10, 20)).unwrap();
    let first = orchestrate(dir.path(), &["run", "--quiet", "--jobs", &jobs, "p.yaml"]);
    let noop = median((0..7).map(|_| orchestrate(dir.path(), &["run", "--quiet", "p.yaml"])).collect());
    let plan200 = median((0..7).map(|_| orchestrate(dir.path(), &["plan", "p.yaml"])).collect());
    println!("200-stage pipeline (10 layers x 20 stages), --jobs {jobs}:");
    println!(
        "  first run          {:>8.3} s   ({:.2} ms a stage; target <= 2 s; DVC 3.67: 33.2 s)",
        first,
        first * 1000.0 / 200.0
    );
    println!("  no-op re-run       {:>8.1} ms  (median of 7; target <= 50 ms; DVC 3.67: 1540 ms)", noop * 1000.0);
    println!("  plan, all cached   {:>8.1} ms  (median of 7)", plan200 * 1000.0);

    let big = tempfile::tempdir().expect("temp dir");
    std::fs::write(big.path().join("big.yaml"), pipeline(100, 100)).unwrap();
    let fresh = median((0..3).map(|_| orchestrate(big.path(), &["plan", "big.yaml"])).collect());
    let validate = median((0..3).map(|_| orchestrate(big.path(), &["validate", "big.yaml"])).collect());
    println!("10,000 synthetic nodes (100 layers x 100):");
    println!("  validate (parse + compile)   {:>8.1} ms", validate * 1000.0);
    println!("  plan, fresh workspace        {:>8.1} ms  (target <= 1 s)", fresh * 1000.0);
    if std::env::var_os("ORCHESTRATE_BENCH_FULL").is_some() {
        let run = orchestrate(big.path(), &["run", "--quiet", "--jobs", &jobs, "big.yaml"]);
        let cached = median((0..3).map(|_| orchestrate(big.path(), &["plan", "big.yaml"])).collect());
        let noop = median((0..3).map(|_| orchestrate(big.path(), &["run", "--quiet", "big.yaml"])).collect());
        println!("  first run                    {:>8.1} s", run);
        println!("  plan, all cached             {:>8.1} ms  (target <= 1 s)", cached * 1000.0);
        println!("  no-op re-run                 {:>8.1} ms", noop * 1000.0);
    } else {
        println!("  (set ORCHESTRATE_BENCH_FULL=1 to also run them and plan with all 10,000 cached)");
    }
}
