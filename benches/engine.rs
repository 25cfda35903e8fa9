//! Engine benchmark: prints figures beside their references, measured in the
//! same run; asserts nothing (run: `cargo bench --bench engine`).
//!
//! 1. A 200-stage shell lattice (8 layers x 25 stages; a stage reads two
//!    parents and writes a small file): first-run wall time beside the floor
//!    (the same commands, layer by layer, under `xargs -P JOBS`) and beside
//!    Snakemake when the project's venv has it (`$ORCHESTRATE_PYTHON -m
//!    snakemake`); and the no-op re-run beside the process start alone
//!    (`--version`). Medians of 5 pairs, floor then orchestrate, each
//!    pair's own ratio printed too (35 runs for the re-runs); the same
//!    first runs on tmpfs (`/dev/shm`), where making a file costs least; and
//!    what making a file costs on each, before and after the pairs.
//! 2. `orchestrate plan` on a spec of 10,000 synthetic nodes (100 layers x 100),
//!    in a fresh workspace and, optionally, with all of them cached
//!    (`ORCHESTRATE_BENCH_FULL=1`: runs the 10,000 nodes first, ~1 min).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// One stage: its command, its parents' files, its own file.
type Stage = (String, Vec<String>, String);

/// Layers of `width` stages: stage `s` of layer `l` reads stages `s`, `s+1`,
/// … (`parents` of them, mod the width) of layer `l-1`. Two parents: the
/// 200-stage lattice; one: the 10,000-node chain.
fn lattice(layers: usize, width: usize, parents: usize) -> Vec<Vec<Stage>> {
    let file = |l: usize, s: usize| format!("d/l{l}s{s}.txt");
    (0..layers)
        .map(|l| {
            (0..width)
                .map(|s| {
                    let out = file(l, s);
                    if l == 0 {
                        (format!("echo {s} > {out}"), Vec::new(), out)
                    } else {
                        let deps: Vec<String> = (0..parents).map(|k| file(l - 1, (s + k) % width)).collect();
                        (format!("cat {} > {out}; echo {l} >> {out}", deps.join(" ")), deps, out)
                    }
                })
                .collect()
        })
        .collect()
}

fn lattice_spec(lattice: &[Vec<Stage>]) -> String {
    let mut yaml = String::from("name: lattice\nnodes:\n");
    for (l, layer) in lattice.iter().enumerate() {
        for (s, (cmd, deps, out)) in layer.iter().enumerate() {
            yaml.push_str(&format!(
                "  l{l}s{s}:\n    op: shell\n    params: {{cmd: '{cmd}', deps: [{}], outs: [{out}]}}\n",
                deps.join(", ")
            ));
        }
    }
    yaml
}

fn snakefile(lattice: &[Vec<Stage>]) -> String {
    let mut rules = String::from("rule all:\n    input:\n");
    for (_, _, out) in lattice.last().expect("a layer") {
        rules.push_str(&format!("        \"{out}\",\n"));
    }
    for (l, layer) in lattice.iter().enumerate() {
        for (s, (cmd, deps, out)) in layer.iter().enumerate() {
            let input = deps.iter().map(|d| format!("\"{d}\"")).collect::<Vec<_>>().join(", ");
            rules.push_str(&format!(
                "rule l{l}s{s}:\n    input: [{input}]\n    output: \"{out}\"\n    shell: \"{cmd}\"\n"
            ));
        }
    }
    rules
}

/// The floor: the same commands, a layer at a time, `xargs -P jobs` each, in
/// a new folder under `root` (kept: see [`first_runs`]).
fn floor(lattice: &[Vec<Stage>], jobs: &str, root: &Path) -> f64 {
    let dir = tempfile::tempdir_in(root).expect("temp dir").keep();
    std::fs::create_dir(dir.join("d")).unwrap();
    let layers: Vec<String> =
        lattice.iter().map(|layer| layer.iter().map(|(c, _, _)| format!("{c}\n")).collect()).collect();
    let start = Instant::now();
    for commands in &layers {
        let mut xargs = Command::new("xargs")
            .args(["-d", "\n", "-P", jobs, "-n", "1", "sh", "-c"])
            .current_dir(&dir)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("xargs runs");
        std::io::Write::write_all(&mut xargs.stdin.take().unwrap(), commands.as_bytes()).unwrap();
        assert!(xargs.wait().unwrap().success(), "a floor command failed");
    }
    start.elapsed().as_secs_f64()
}

/// Snakemake's first run in a fresh folder, when the venv has it.
fn snakemake(lattice: &[Vec<Stage>], jobs: &str) -> Option<(f64, f64)> {
    let python = std::env::var_os("ORCHESTRATE_PYTHON")?;
    let has = Command::new(&python).args(["-m", "snakemake", "--version"]).output().ok()?;
    if !has.status.success() {
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("Snakefile"), snakefile(lattice)).unwrap();
    let run = || {
        let start = Instant::now();
        let out = Command::new(&python)
            .args(["-m", "snakemake", "--cores", jobs, "--quiet", "all"])
            .current_dir(dir.path())
            .output()
            .expect("snakemake runs");
        assert!(out.status.success(), "snakemake failed: {}", String::from_utf8_lossy(&out.stderr));
        start.elapsed().as_secs_f64()
    };
    let first = run();
    let noop = run();
    Some((first, noop))
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
    let ten_thousand = ten_thousand(&jobs);
    let shape = lattice(8, 25, 2);
    let kept = tempfile::tempdir().expect("temp dir");
    let file_before = file_cost(kept.path());
    let (floors, firsts, dir) = first_runs(&shape, &jobs, kept.path(), 5);
    let file_after = file_cost(kept.path());
    let mut noops = Vec::new();
    let mut plans = Vec::new();
    let mut starts = Vec::new();
    for _ in 0..5 {
        noops.extend((0..7).map(|_| orchestrate(&dir, &["run", "--quiet", "p.yaml"])));
        starts.extend((0..7).map(|_| orchestrate(&dir, &["--version"])));
        plans.extend((0..7).map(|_| orchestrate(&dir, &["plan", "p.yaml"])));
    }
    let pairs: Vec<String> = firsts.iter().zip(&floors).map(|(f, fl)| format!("{:.2}", f / fl)).collect();
    let (first, floor) = (median(firsts), median(floors));
    println!("200-stage lattice (8 layers x 25 stages, two parents each), {jobs} jobs, medians of 5:");
    println!("  floor: the commands layer by layer, xargs -P {jobs}   {floor:>8.3} s");
    println!(
        "  orchestrate run --jobs {jobs}, first run          {first:>8.3} s  = {:.2}x the floor (target <= 1.3x)",
        first / floor
    );
    println!("    each pair's own ratio, in order: {}", pairs.join(", "));
    // Where creating a file costs least: memory (`/dev/shm`, when it is there).
    let shm = Path::new("/dev/shm");
    let mut file_in_memory = None;
    if let Ok(in_memory) = tempfile::tempdir_in(shm) {
        file_in_memory = Some(file_cost(in_memory.path()));
        let (floors, firsts, _) = first_runs(&shape, &jobs, in_memory.path(), 5);
        let (first, floor) = (median(firsts), median(floors));
        println!(
            "  the same in memory (/dev/shm, tmpfs): floor {floor:.3} s, first run {first:.3} s = {:.2}x",
            first / floor
        );
    }
    println!(
        "  making a small file on this disk: {file_before:.1} us before the pairs, {file_after:.1} us after{}",
        file_in_memory.map(|m| format!(" ({m:.1} us in memory)")).unwrap_or_default()
    );
    println!("    (a first run makes about three new files or folders per node to the floor's one)");
    match snakemake(&shape, &jobs) {
        Some((s_first, s_noop)) => println!(
            "  snakemake --cores {jobs}, first run               {s_first:>8.3} s  = {:.2}x the floor (no-op re-run {:.0} ms)",
            s_first / floor,
            s_noop * 1000.0
        ),
        None => println!("  (snakemake: not in the venv; `$ORCHESTRATE_PYTHON -m pip install snakemake` to compare)"),
    }
    println!(
        "  orchestrate no-op re-run                  {:>8.1} ms (median of 35; target <= 10 ms)",
        median(noops) * 1000.0
    );
    println!(
        "    of which starting the process           {:>8.1} ms (`orchestrate --version`, median of 35)",
        median(starts) * 1000.0
    );
    println!("  orchestrate plan, all cached              {:>8.1} ms (median of 35)", median(plans) * 1000.0);

    for line in ten_thousand {
        println!("{line}");
    }
}

/// What making a small file (and writing two bytes to it) costs in a new
/// folder under `root`, in microseconds: the median of 3 batches of 200. On
/// ext4 without a journal this moves with how many inodes the machine freed in
/// the last minutes (each new file first scans past them), and a first run
/// makes about three new inodes per node (its out, the store's copy, and for
/// most of the first 256 objects a shard folder) where the floor makes one, so
/// its ratio to the floor rises with this figure. The folder is kept, like
/// [`first_runs`]'s.
fn file_cost(root: &Path) -> f64 {
    let dir = tempfile::tempdir_in(root).expect("temp dir").keep();
    let batches = (0..3)
        .map(|b| {
            let start = Instant::now();
            for i in 0..200 {
                std::fs::write(dir.join(format!("{b}-{i}")), b"1\n").expect("a file is made");
            }
            start.elapsed().as_secs_f64() / 200.0
        })
        .collect();
    median(batches) * 1e6
}

/// `pairs` first runs, each right after the floor, every folder a new one
/// under `root` and kept until the bench ends: on ext4 without a journal (these
/// machines' disks) a file made within a minute of others being deleted first
/// scans past every inode freed then, so deleting one pair's folders would
/// slow the next pair's runs (both sides, orchestrate's more: it makes a copy
/// of each out in its store, twice the floor's new files). Returns the
/// floors, the first runs and the last run's folder. One pair before them is
/// not counted: the first pair of a bench (run right after the 10,000-node
/// figures' folder is deleted) ran 1.9 and 2.3 times the floor where the four
/// after it ran 1.2 to 1.5.
fn first_runs(shape: &[Vec<Stage>], jobs: &str, root: &Path, pairs: usize) -> (Vec<f64>, Vec<f64>, std::path::PathBuf) {
    let (mut floors, mut firsts, mut last) = (Vec::new(), Vec::new(), root.to_path_buf());
    for _ in 0..=pairs {
        floors.push(floor(shape, jobs, root));
        let dir = tempfile::tempdir_in(root).expect("temp dir").keep();
        std::fs::write(dir.join("p.yaml"), lattice_spec(shape)).unwrap();
        firsts.push(orchestrate(&dir, &["run", "--quiet", "--jobs", jobs, "p.yaml"]));
        last = dir;
    }
    (floors.split_off(1), firsts.split_off(1), last)
}

/// The 10,000-node figures, as lines to print (measured first, printed last).
/// Each `plan` run is printed: under `cargo bench` one or two of the three
/// have taken twice the others (327, 145, 309 ms) where the same binary run
/// alone, 3 × 4 times, took 121 to 128 ms; the cause is not found yet.
fn ten_thousand(jobs: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let big = tempfile::tempdir().expect("temp dir");
    std::fs::write(big.path().join("big.yaml"), lattice_spec(&lattice(100, 100, 1))).unwrap();
    // Each run is printed, so one slowed by something else shows.
    let fresh_runs: Vec<f64> = (0..3).map(|_| orchestrate(big.path(), &["plan", "big.yaml"])).collect();
    let fresh = median(fresh_runs.clone());
    let validate = median((0..3).map(|_| orchestrate(big.path(), &["validate", "big.yaml"])).collect());
    lines.push("10,000 synthetic nodes (100 layers x 100):".to_string());
    lines.push(format!("  validate (parse + compile)   {:>8.1} ms", validate * 1000.0));
    let runs: Vec<String> = fresh_runs.iter().map(|t| format!("{:.0}", t * 1000.0)).collect();
    lines.push(format!(
        "  plan, fresh workspace        {:>8.1} ms  (target <= 200 ms; runs {} ms)",
        fresh * 1000.0,
        runs.join(", ")
    ));
    if std::env::var_os("ORCHESTRATE_BENCH_FULL").is_some() {
        let run = orchestrate(big.path(), &["run", "--quiet", "--jobs", jobs, "big.yaml"]);
        let cached = median((0..3).map(|_| orchestrate(big.path(), &["plan", "big.yaml"])).collect());
        let noop = median((0..3).map(|_| orchestrate(big.path(), &["run", "--quiet", "big.yaml"])).collect());
        lines.push(format!("  first run                    {:>8.1} s", run));
        lines.push(format!("  plan, all cached             {:>8.1} ms", cached * 1000.0));
        lines.push(format!("  no-op re-run                 {:>8.1} ms", noop * 1000.0));
    } else {
        lines.push("  (set ORCHESTRATE_BENCH_FULL=1 to also run them and plan with all 10,000 cached)".to_string());
    }
    lines
}
