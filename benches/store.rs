//! Store benchmark (#31): prints figures, asserts nothing
//! (run: `cargo bench --bench store`; `ORCHESTRATE_BENCH_DVC=/path/to/dvc`
//! adds DVC side by side, else `dvc` on PATH if there is one).
//!
//! 1. A folder out of 10,000 small files, and one of 2 GB (8 files of 256 MiB):
//!    hash and store it (a node whose command `mv`s a ready folder into place,
//!    so the command itself costs nothing), a no-op re-run (stat check), and a
//!    checkout after the folder is deleted; beside `dvc add`, `dvc status` and
//!    `dvc checkout` of the same folder, in the same run.
//! 2. `gc` over a store of 10,000 objects: `gc --dry-run`, then `gc` removing half.
//!
//! `ORCHESTRATE_BENCH_BIG_MB` sets the big folder's size (default 2048). Each
//! timed step starts after a `sync`, and the page cache is warm for both tools.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn timed(dir: &Path, program: &Path, args: &[&str]) -> f64 {
    // Each step starts with no dirty pages left by the one before (another
    // tool's 2 GB write-back would otherwise land in this one's time).
    let _ = Command::new("sync").status();
    let start = Instant::now();
    let out = Command::new(program).args(args).current_dir(dir).output().expect("the program runs");
    let secs = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    secs
}

fn ours() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_orchestrate"))
}

fn dvc() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ORCHESTRATE_BENCH_DVC") {
        return Some(PathBuf::from(p));
    }
    let found = Command::new("sh").args(["-c", "command -v dvc"]).output().ok()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// Writes the folder `root/name`: `small` files of 100 bytes in 100 folders,
/// or `big_files` files of `big_mb / big_files` MiB of pseudo-random bytes.
fn make_folder(at: &Path, small: usize, big_mb: usize, big_files: usize) {
    std::fs::create_dir_all(at).unwrap();
    if small > 0 {
        for i in 0..small {
            let sub = at.join(format!("shard-{:02}", i % 100));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(
                sub.join(format!("row-{i:05}.json")),
                format!("{{\"i\": {i:05}, \"pad\": \"{}\"}}\n", "x".repeat(76)),
            )
            .unwrap();
        }
    } else {
        let per = big_mb / big_files;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut block = vec![0u8; 1 << 20];
        for f in 0..big_files {
            use std::io::Write;
            let mut out = std::io::BufWriter::new(std::fs::File::create(at.join(format!("part-{f}.bin"))).unwrap());
            for _ in 0..per {
                for chunk in block.chunks_mut(8) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
                }
                out.write_all(&block).unwrap();
            }
        }
    }
}

struct Figures {
    store: f64,
    noop: f64,
    checkout: f64,
}

fn bench_ours(name: &str, small: usize, big_mb: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    make_folder(&dir.path().join("ready"), small, big_mb, 8);
    std::fs::write(
        dir.path().join("s.yaml"),
        "name: store-bench\nnodes:\n  put:\n    op: shell\n    params: {cmd: 'mv ready data', outs: [data]}\n",
    )
    .unwrap();
    let store = timed(dir.path(), &ours(), &["run", "--quiet", "s.yaml"]);
    let noop = timed(dir.path(), &ours(), &["run", "--quiet", "s.yaml"]);
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let checkout = timed(dir.path(), &ours(), &["checkout", "s.yaml"]);
    let _ = name;
    Figures { store, noop, checkout }
}

fn bench_dvc(dvc: &Path, small: usize, big_mb: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    make_folder(&dir.path().join("data"), small, big_mb, 8);
    timed(dir.path(), dvc, &["init", "--no-scm", "-q"]);
    let store = timed(dir.path(), dvc, &["add", "-q", "data"]);
    let noop = timed(dir.path(), dvc, &["status", "-q", "data.dvc"]);
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let checkout = timed(dir.path(), dvc, &["checkout", "-q", "data.dvc"]);
    Figures { store, noop, checkout }
}

fn gc_bench(objects: usize) {
    let dir = tempfile::tempdir().unwrap();
    let half = objects / 2;
    // One matrix node of `half` expansions, each writing one file: run twice
    // with another content, so the store holds `objects` objects and the
    // latest run needs half of them.
    let spec = |salt: &str| {
        format!(
            "name: gc-bench\nnodes:\n  w:\n    op: shell\n    matrix: {{env.I: {{labels: [{}]}}}}\n    params: {{cmd: 'echo {salt}${{matrix.env.I}} > o/${{matrix.env.I}}', outs: ['o/${{matrix.env.I}}']}}\n",
            (0..half).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
        )
    };
    std::fs::write(dir.path().join("a.yaml"), spec("a")).unwrap();
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
    let first = timed(dir.path(), &ours(), &["run", "--quiet", "-j", &jobs, "a.yaml"]);
    std::fs::write(dir.path().join("a.yaml"), spec("b")).unwrap();
    timed(dir.path(), &ours(), &["run", "--quiet", "-j", &jobs, "a.yaml"]);
    let dry = timed(dir.path(), &ours(), &["gc", "a.yaml", "--dry-run"]);
    let gc = timed(dir.path(), &ours(), &["gc", "a.yaml"]);
    let du = timed(dir.path(), &ours(), &["du"]);
    println!("gc over a store of {objects} objects ({half} results of the latest run kept; a run of {half} nodes took {first:.1} s):");
    println!("  gc --dry-run  {dry:>8.3} s");
    println!("  gc            {gc:>8.3} s   (removes {half} results and their objects)");
    println!("  du            {du:>8.3} s");
}

fn main() {
    let big_mb: usize = std::env::var("ORCHESTRATE_BENCH_BIG_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    let dvc = dvc();
    let version = dvc
        .as_ref()
        .and_then(|d| Command::new(d).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    for (label, small, big) in [("10,000 files of 100 B", 10_000, 0), (&*format!("{big_mb} MiB in 8 files"), 0, big_mb)]
    {
        let o = bench_ours(label, small, big);
        println!("folder out of {label}:");
        match &dvc {
            Some(d) => {
                let v = bench_dvc(d, small, big);
                let ver = version.as_deref().unwrap_or("?");
                println!("  {:<28} {:>9} {:>9} {:>8}", "", "ours", format!("DVC {ver}"), "ratio");
                for (what, a, b) in [
                    ("hash + store (run / add)", o.store, v.store),
                    ("no-op check (run / status)", o.noop, v.noop),
                    ("checkout after rm -rf", o.checkout, v.checkout),
                ] {
                    println!("  {what:<28} {a:>8.3}s {b:>8.3}s {:>7.2}x", b / a);
                }
            }
            None => {
                println!("  hash + store (run)   {:>8.3} s", o.store);
                println!("  no-op check (run)    {:>8.3} s", o.noop);
                println!("  checkout             {:>8.3} s", o.checkout);
                println!("  (no dvc found: set ORCHESTRATE_BENCH_DVC or put dvc on PATH to compare)");
            }
        }
    }
    gc_bench(10_000);
}
