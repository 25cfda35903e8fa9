//! SIGKILL at any moment leaves nothing half-published; two runs on one
//! workspace never execute the same node twice.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{nodes_with, stdout, Project};

/// A chain of five slow nodes; each appends its id to `executions.log` when it
/// starts, and starts a long-lived grandchild (a shell of its own) that it
/// kills when it is done.
fn slow_chain(p: &Project) {
    let mut yaml = String::from("name: slow\nnodes:\n");
    for i in 0..5 {
        let dep = if i == 0 { String::new() } else { format!(", deps: [out{}.txt]", i - 1) };
        let input = if i == 0 { "echo seed".to_string() } else { format!("cat out{}.txt", i - 1) };
        yaml.push_str(&format!(
            "  n{i}:\n    op: shell\n    params: {{cmd: \"echo n{i} >> executions.log; sh -c 'sleep 30; echo n{i} >> late.log' & G=$!; sleep 0.15; ({input}; echo step{i}) > out{i}.txt; kill $G\"{dep}, outs: [out{i}.txt]}}\n"
        ));
    }
    p.write("spec.yaml", &yaml);
}

fn expected_last() -> String {
    let mut s = String::from("seed\n");
    for i in 0..5 {
        s.push_str(&format!("step{i}\n"));
    }
    s
}

/// Processes whose working folder is `dir` (every process a node starts runs
/// there), with their command lines; zombies have none and are not counted.
fn processes_in(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else { continue };
        if cwd == dir {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

/// Waits (at most 3 s) until no process runs in `dir`; returns those left.
fn left_running(dir: &std::path::Path) -> Vec<String> {
    let until = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let left = processes_in(dir);
        if left.is_empty() || std::time::Instant::now() > until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// 20 moments, drawn afresh each time (the seed is printed to replay a failure
/// with ORCHESTRATE_TEST_SEED).
fn kill_moments() -> Vec<u64> {
    let seed: u64 = std::env::var("ORCHESTRATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("kill moments: ORCHESTRATE_TEST_SEED={seed}");
    let mut x = seed | 1;
    (0..20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            10 + x % 1500
        })
        .collect()
}

#[test]
fn sigkill_at_any_moment_then_rerun_completes_with_nothing_corrupted_or_left_running() {
    for delay_ms in kill_moments() {
        let p = Project::new();
        slow_chain(&p);
        let mut child = p.cmd(&["run", "--quiet", "spec.yaml"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Nothing the run started keeps going: not the node's shell, not its grandchildren.
        let left = left_running(p.path());
        assert!(left.is_empty(), "after kill at {delay_ms} ms, still running: {left:?}");

        // The next run needs no unlock and completes from the nodes that finished.
        let ev = p.run_json(&["spec.yaml"], 0);
        assert_eq!(nodes_with(&ev, "node_failed"), Vec::<String>::new(), "after kill at {delay_ms} ms");
        assert_eq!(p.read("out4.txt"), expected_last(), "after kill at {delay_ms} ms");
        // Every cached object hashes to its recorded hash.
        let verify = p.run(&["verify"]);
        assert_eq!(verify.status.code(), Some(0), "verify after kill at {delay_ms} ms: {}", stdout(&verify));
        // No staging is left behind once a run has cleaned up after the killed one.
        let leftovers: Vec<_> = std::fs::read_dir(p.path().join(".orchestrate/tmp")).unwrap().collect();
        assert!(leftovers.is_empty(), "staging left after kill at {delay_ms} ms: {leftovers:?}");
        // Nodes that completed before the kill were not executed again.
        let log = p.read("executions.log");
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for line in log.lines() {
            *counts.entry(line).or_default() += 1;
        }
        for hit in nodes_with(&ev, "cache_hit") {
            assert_eq!(counts.get(hit.as_str()), Some(&1), "{hit} was cached yet executed again: {log}");
        }
        let again = p.run_json(&["spec.yaml"], 0);
        assert_eq!(nodes_with(&again, "cache_hit").len(), 5);
    }
}

#[test]
fn two_concurrent_runs_never_execute_a_node_twice() {
    for _ in 0..3 {
        let p = Project::new();
        slow_chain(&p);
        let spawn = || {
            p.cmd(&["run", "--json", "spec.yaml"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        for out in [&a, &b] {
            assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(out), common::stderr(out));
        }
        let log = p.read("executions.log");
        let mut lines: Vec<&str> = log.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["n0", "n1", "n2", "n3", "n4"], "each node executed exactly once");
        // Between them every node resolved, and the one that waited said so.
        let (ea, eb) = (common::events(&a), common::events(&b));
        let ran = nodes_with(&ea, "node_finished").len() + nodes_with(&eb, "node_finished").len();
        assert_eq!(ran, 5);
        let waited = ea.iter().chain(&eb).filter(|e| e["event"] == "waiting").count();
        assert!(waited >= 1, "the second run waits for the node the first holds");
        let reason =
            ea.iter().chain(&eb).find(|e| e["event"] == "waiting").unwrap()["reason"].as_str().unwrap().to_string();
        assert!(reason.contains("another orchestrate process is running node"), "{reason}");
        assert_eq!(p.read("out4.txt"), expected_last());
    }
}

/// orchestrate dying right after it started a node, while the node's command
/// already started a background process: the watchdog had not been told the
/// group yet, so that process outlived the run (CI caught one such survivor).
#[test]
fn a_node_started_just_before_orchestrate_dies_leaves_nothing_running() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: \"sh -c 'sleep 30' & sleep 30\", outs: [a.txt]}\n",
    );
    let out = p.cmd(&["run", "--quiet", "spec.yaml"]).env("ORCHESTRATE_FAILPOINT", "spawned").output().unwrap();
    // Aborted at the failpoint (a signal, no exit code), not ended some other way.
    assert_eq!(out.status.code(), None, "orchestrate did not die at the failpoint: {out:?}");
    let left = left_running(p.path());
    assert!(left.is_empty(), "still running: {left:?}");
}

/// Orchestrate dying after starting a node's process and before its
/// watchdog holds the process's group: the node's command never runs (it
/// waits at its gate, which closes), and nothing is left running.
#[test]
fn a_node_started_before_its_watchdog_knew_it_runs_nothing() {
    let p = Project::new();
    p.write(
        "spec.yaml",
        "name: s\nnodes:\n  a:\n    op: shell\n    params: {cmd: \"touch ran; sh -c 'sleep 30' & sleep 30\", outs: [a.txt]}\n",
    );
    let out =
        p.cmd(&["run", "--quiet", "spec.yaml"]).env("ORCHESTRATE_FAILPOINT", "spawned-unwatched").output().unwrap();
    assert_eq!(out.status.code(), None, "orchestrate did not die at the failpoint: {out:?}");
    let left = left_running(p.path());
    assert!(left.is_empty(), "still running: {left:?}");
    assert!(!p.path().join("ran").exists(), "the command ran though its watchdog never held it");
}

#[test]
fn dry_run_changes_nothing() {
    let p = Project::new();
    slow_chain(&p);
    // No workspace yet: none is created.
    let out = p.run(&["run", "--dry-run", "spec.yaml"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("n0"));
    assert!(!p.path().join(".orchestrate").exists());
    assert!(!p.path().join("out0.txt").exists());

    // With a workspace: its files are byte-identical afterwards.
    p.run_json(&["spec.yaml"], 0);
    p.write("spec.yaml", &p.read("spec.yaml").replace("step3", "STEP3"));
    let snapshot = |p: &Project| {
        let mut files = BTreeMap::new();
        let mut stack = vec![p.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    files.insert(e.path(), blake3::hash(&std::fs::read(e.path()).unwrap()).to_hex().to_string());
                }
            }
        }
        files
    };
    let before = snapshot(&p);
    let out = p.run(&["run", "--dry-run", "spec.yaml"]);
    let text = stdout(&out);
    assert!(text.contains("params.cmd"), "{text}");
    assert!(text.contains("pending"), "{text}");
    let after = snapshot(&p);
    // SQLite may create its empty -wal/-shm bookkeeping files to read a WAL
    // database; the database file and its logical content must not change.
    let bookkeeping = |k: &std::path::PathBuf| {
        let name = k.file_name().unwrap().to_string_lossy().into_owned();
        name.ends_with("-shm") || name.ends_with("-wal")
    };
    let changed: Vec<_> =
        before.keys().chain(after.keys()).filter(|k| !bookkeeping(k) && before.get(*k) != after.get(*k)).collect();
    assert!(changed.is_empty(), "--dry-run changed {changed:?}");
    let wal = p.path().join(".orchestrate/cache.sqlite-wal");
    assert!(!wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0, "--dry-run wrote to the WAL");
}

#[test]
fn a_damaged_index_is_said_once_with_how_to_recover_and_the_advice_works() {
    let p = Project::new();
    p.write("spec.yaml", common::CHAIN);
    assert_eq!(p.run(&["run", "spec.yaml"]).status.code(), Some(0));
    // Checkpoint the WAL into the file, then cut the file in half.
    assert_eq!(p.run(&["status"]).status.code(), Some(0));
    let index = p.path().join(".orchestrate/cache.sqlite");
    for side in ["cache.sqlite-wal", "cache.sqlite-shm"] {
        let _ = std::fs::remove_file(p.path().join(".orchestrate").join(side));
    }
    let len = std::fs::metadata(&index).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&index).unwrap().set_len(len / 2).unwrap();

    let out = p.run(&["run", "spec.yaml"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is damaged") && err.contains(&index.display().to_string()), "{err}");
    assert_eq!(err.matches("malformed").count(), 1, "said once: {err}");
    assert!(err.contains(&format!("mv {} {}.damaged", index.display(), index.display())), "{err}");
    assert!(err.contains("orchestrate reindex"), "{err}");

    // Following the advice: the index moved aside and rebuilt from the node
    // records, with every object re-hashed; no node runs again.
    std::fs::rename(&index, index.with_extension("sqlite.damaged")).unwrap();
    // One object no longer hashes to its name: its node is left out, and runs again.
    let d = p.path().join("d.txt");
    let objects = p.path().join(".orchestrate/objects");
    let hash = blake3::hash(&std::fs::read(&d).unwrap()).to_hex().to_string();
    let obj = objects.join(&hash[..2]).join(&hash);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&obj, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&obj, "DELTA\n").unwrap();
    }
    reindex_leaves_d_out_and_a_run_makes_it_again(&p, "does not hash to its name");
    assert_eq!(p.read("c.txt"), "ALPHA\nALPHA\n");
    assert_eq!(p.run(&["verify"]).status.code(), Some(0));
    // Re-indexing again changes nothing.
    let again = stdout(&p.run(&["reindex"]));
    assert!(again.contains("0 nodes re-indexed") && again.contains("4 already in the index"), "{again}");
}

/// Unmounts a test's tmpfs when the test ends, passed or not.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A project on a tmpfs of 3 MB, unmounted when the guard drops; `None`
/// (saying so) when not root, as mounting needs it (CI runs as root).
fn project_on_a_small_disk() -> Option<(Project, Unmount)> {
    // SAFETY: a plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        common::skip("a test on a small tmpfs", "mounting a tmpfs needs root; CI runs as root");
        return None;
    }
    let p = Project::new();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(p.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "root, yet mount -t tmpfs failed");
    let unmount = Unmount(p.path().to_path_buf());
    Some((p, unmount))
}

/// An out holding bytes the store lacks is moved into the workspace's trash:
/// a rename, and with the workspace on another filesystem (`--workspace`
/// elsewhere, the project here on a tmpfs) a copy and then the removal, as
/// `mv` does. A link in it cannot be copied: the node fails saying so, with
/// every byte of the out where it was. Never removed without a copy.
#[test]
fn an_out_the_store_lacks_is_copied_into_a_trash_on_another_filesystem_before_it_goes() {
    let Some((p, _unmount)) = project_on_a_small_disk() else { return };
    let elsewhere = tempfile::tempdir().unwrap();
    let ws = elsewhere.path().join("ws");
    p.write("s.yaml", "name: s\nnodes:\n  w:\n    op: shell\n    params: {cmd: 'mkdir -p res && echo 42 > res/score.txt', outs: [res]}\n");
    p.write("res/precious.csv", "mine\n");
    p.write("res/sub/deeper.csv", "mine too\n");
    std::os::unix::fs::symlink("precious.csv", p.path().join("res/link")).unwrap();
    let run = || p.run(&["run", "s.yaml", "--workspace", ws.to_str().unwrap()]);
    let out = run();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{}{err}", stdout(&out));
    assert!(err.contains("could not be moved") && err.contains("res/link"), "{err}");
    assert_eq!((p.read("res/precious.csv"), p.read("res/sub/deeper.csv")), ("mine\n".into(), "mine too\n".into()));
    assert!(!p.path().join("res/score.txt").exists(), "the command ran");
    let trash = ws.join("trash");
    let copied = std::fs::read_dir(&trash).map(|d| d.count()).unwrap_or(0);
    assert_eq!(copied, 0, "a partial copy stayed in the trash: {:?}", common::tree_of(&trash).keys());

    std::fs::remove_file(p.path().join("res/link")).unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), common::stderr(&out));
    assert!(stdout(&out).contains("moved to"), "{}", stdout(&out));
    let kept: Vec<String> = common::tree_of(&trash).into_keys().collect();
    assert!(
        kept.iter().any(|f| f.ends_with("/res/precious.csv"))
            && kept.iter().any(|f| f.ends_with("/res/sub/deeper.csv")),
        "{kept:?}"
    );
    assert_eq!(p.read("res/score.txt"), "42\n");
    assert!(!p.path().join("res/precious.csv").exists());
}

#[test]
fn a_full_disk_fails_the_node_with_its_reason_keeps_the_log_and_exits_1() {
    let Some((p, _unmount)) = project_on_a_small_disk() else { return };
    p.write(
        "s.yaml",
        // `big` reads small.txt, so `small` finishes (and is cached) before `big`
        // fills the disk: run side by side, `small` could lose the race and fail too.
        "name: full\nnodes:\n  small:\n    op: shell\n    params: {cmd: \"echo ok > small.txt\", outs: [small.txt]}\n  big:\n    op: shell\n    params: {cmd: \"head -c 8000000 /dev/zero > big.bin\", deps: [small.txt], outs: [big.bin]}\n",
    );
    let out = p.run(&["run", "s.yaml"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "a failed node is exit 1, not an error of orchestrate:\n{err}");
    assert!(err.contains("big") && err.contains("No space left on device"), "{err}");
    // The node's log holds the reason.
    let logs: Vec<String> = std::fs::read_dir(p.path().join(".orchestrate/logs"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert!(logs.iter().any(|l| l.contains("No space left on device")), "{logs:?}");
    // The run and its failure are recorded.
    let status = stdout(&p.run(&["status"]));
    assert!(status.contains("big") && status.contains("failed"), "{status}");
    // With room again (a smaller output), the next run completes; small was kept.
    let spec = p.read("s.yaml").replace("8000000", "1000");
    p.write("s.yaml", &spec);
    let ev = p.run_json(&["s.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["big"]);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["small"]);
}

#[test]
fn a_disk_that_stays_full_still_fails_the_node_with_its_reason_and_exits_1() {
    let Some((p, _unmount)) = project_on_a_small_disk() else { return };
    // The space goes to a file nobody removes: nothing can be written after it.
    p.write(
        "s.yaml",
        "name: full\nnodes:\n  fill:\n    op: shell\n    params: {cmd: \"head -c 8000000 /dev/zero > junk.bin\", outs: [done.txt]}\n",
    );
    let out = p.run(&["run", "s.yaml"]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "a failed node is exit 1, not an error of orchestrate:\n{err}");
    assert!(err.contains("fill") && err.contains("No space left on device"), "{err}");
    assert!(err.contains("could not be recorded"), "the lost record is said: {err}");
}

/// (Issue #36.) Two `orchestrate run`s side by side share the machine's CPU:
/// each counted every core as its own, so two runs of `-j 4` put four
/// one-thread numerical nodes on two cores. The slots are machine-wide now
/// (a lock file per core): measured from both runs' events as they arrive,
/// never more numerical nodes run at once than the machine has cores.
#[cfg(feature = "torch")]
#[test]
fn two_runs_side_by_side_never_put_more_numerical_nodes_on_the_cpu_than_it_has_cores() {
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    let slots = tempfile::tempdir().unwrap();
    let sft = |name: &str, lr: &str| {
        format!(
            "  {name}:\n    op: train.sft\n    inputs: {{model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation'}}\n    params: {{branch: warmstart, epochs: 2, batch_size: 2, lr: {lr}}}\n"
        )
    };
    let nodes = format!("{}{}{}", sft("a", "1.0e-3"), sft("b", "2.0e-3"), sft("c", "3.0e-3"));
    let spec = common::tiny_spec("side", &nodes);
    let start = Instant::now();
    // (seconds since start, +1 started / -1 finished, run, node) of numerical nodes.
    type Seen = Vec<(f64, i32, usize, String)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let numerical = ["base", "a", "b", "c"];
    let mut readers = Vec::new();
    let mut children = Vec::new();
    let projects = [Project::new(), Project::new()];
    for (run, p) in projects.iter().enumerate() {
        p.write("s.yaml", &spec);
        let mut child = p
            .cmd(&["run", "--json", "-j", "4", "s.yaml"])
            .env("ORCHESTRATE_CPU_SLOTS_DIR", slots.path())
            .env("ORCHESTRATE_THREADS", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let seen = Arc::clone(&seen);
        readers.push(std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let e: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
                let node = e["node"].as_str().unwrap_or_default().to_string();
                let step = match e["event"].as_str() {
                    Some("node_started") => 1,
                    Some("node_finished") | Some("node_failed") => -1,
                    _ => continue,
                };
                if numerical.contains(&node.as_str()) {
                    seen.lock().unwrap().push((start.elapsed().as_secs_f64(), step, run, node));
                }
            }
        }));
        children.push(child);
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    for r in readers {
        r.join().unwrap();
    }
    let mut seen = seen.lock().unwrap().clone();
    // A run says a node finished just after its slot was freed, and the other
    // run may start one on that slot first: each end is taken 0.1 s earlier
    // than it was read (every node here runs 0.4 s or more, so four nodes on
    // two cores would still overlap).
    for e in seen.iter_mut().filter(|e| e.1 < 0) {
        e.0 -= 0.1;
    }
    seen.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    assert_eq!(seen.len(), 16, "4 numerical nodes × 2 runs, started and finished: {seen:?}");
    let (mut now, mut most) = (0, 0);
    for (_, step, _, _) in &seen {
        now += step;
        most = most.max(now);
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as i32;
    assert!(most <= cores, "{most} numerical nodes ran at once on {cores} cores: {seen:?}");
}

/// A project whose one node writes `out/a.txt`, sleeps `pause` seconds,
/// then writes `out/b.txt`, each saying its env `LR`.
fn slow_out_writer(pause: u32) -> Project {
    let p = Project::new();
    p.write(
        "p.yaml",
        &format!(
            "name: p\nnodes:\n  train:\n    op: shell\n    params:\n      cmd: 'mkdir -p out && echo \"$LR\" > out/a.txt && sleep {pause} && echo \"$LR\" > out/b.txt'\n      outs: [out]\n      env: {{LR: 0.1}}\n"
        ),
    );
    p
}

/// Starts `run --json` of [`slow_out_writer`]'s spec with `LR=lr`.
fn spawn_with_lr(p: &Project, lr: &str) -> std::process::Child {
    p.cmd(&["run", "--json", "p.yaml", "--set", &format!("nodes.train.params.env.LR={lr}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (30 s at most) until a run of [`slow_out_writer`]'s spec has
/// written its first file, so it holds the node and its out.
fn wait_for_first_file(p: &Project) {
    p.wait_for("out/a.txt", 30, "the first run never wrote its out");
}

/// Before, two runs of one spec with different params (two keys, so no node
/// lock between them) wrote the same out folder side by side: the second
/// removed `out` and wrote into it while the first was still running, and
/// the first then stored `out` with the second's file in it under its own
/// key (here `a.txt` said 0.2 under LR=0.1): a poisoned cache, which a push
/// would have shared. An out of the tree is now held by one node at a time,
/// across processes; the other waits, and says why.
#[test]
fn two_runs_writing_the_same_out_with_other_keys_take_turns_and_each_key_keeps_its_own_bytes() {
    let p = slow_out_writer(2);
    let first = spawn_with_lr(&p, "0.1");
    wait_for_first_file(&p);
    let second = spawn_with_lr(&p, "0.2");
    took_turns(&p, first, second, [&[], &[]]);
}

/// Checks that two runs of [`slow_out_writer`]'s spec (LR=0.1 first, then
/// 0.2, each with its extra arguments `args`) both passed, that each key's
/// stored out holds its own bytes only, and that the second waited for the
/// first's out, saying so once.
fn took_turns(p: &Project, first: std::process::Child, second: std::process::Child, args: [&[&str]; 2]) {
    let (a, b) = (first.wait_with_output().unwrap(), second.wait_with_output().unwrap());
    for out in [&a, &b] {
        assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(out), common::stderr(out));
    }
    for (lr, extra) in ["0.1", "0.2"].into_iter().zip(args) {
        let set = format!("nodes.train.params.env.LR={lr}");
        let mut cmd = vec!["path", "p.yaml", "train:out", "--set", &set];
        cmd.extend_from_slice(extra);
        let path = p.run(&cmd);
        assert_eq!(path.status.code(), Some(0), "{}", common::stderr(&path));
        let stored = std::path::PathBuf::from(stdout(&path).trim());
        for file in ["a.txt", "b.txt"] {
            let text = std::fs::read_to_string(stored.join(file)).unwrap();
            assert_eq!(text.trim(), lr, "LR={lr} {extra:?}: the stored {file} says {text:?}");
        }
    }
    let waited: Vec<serde_json::Value> = common::events(&b).into_iter().filter(|e| e["event"] == "waiting").collect();
    assert_eq!(waited.len(), 1, "{}", stdout(&b));
    assert!(waited[0]["reason"].as_str().unwrap().contains("writing the out 'out'"), "{}", waited[0]);
}

/// Before, the outs lock was a byte in each workspace's own lock file, so two
/// runs of one spec with two workspaces (`--workspace a`, `--workspace b`: two
/// researchers' sweeps, or a scratch workspace beside the main one) wrote the
/// same out side by side, and each stored the mix under its own key. The out
/// is now held machine-wide too (a lock file in the user's machine folder,
/// beside the CPU slots): the second run waits for the first, whichever
/// workspace each uses, and each stores its own bytes.
#[test]
fn two_runs_with_two_workspaces_writing_the_same_out_take_turns() {
    let p = slow_out_writer(2);
    let locks = tempfile::tempdir().unwrap();
    let spawn = |ws: &str, lr: &str| {
        p.cmd(&["run", "--json", "--workspace", ws, "p.yaml", "--set", &format!("nodes.train.params.env.LR={lr}")])
            .env("ORCHESTRATE_CPU_SLOTS_DIR", locks.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn("ws-a", "0.1");
    wait_for_first_file(&p);
    let second = spawn("ws-b", "0.2");
    took_turns(&p, first, second, [&["--workspace", "ws-a"], &["--workspace", "ws-b"]]);
}

/// Before, Ctrl-C on a run that waited for another process (its node lock,
/// or an out that run was writing) did nothing until that process finished
/// its node, hours for a training node; the wait then ended in a cache hit
/// and only then the interrupt. A wait now ends with the interrupt: the
/// node is said as not started, the run is recorded as interrupted, exit 130.
#[test]
fn ctrl_c_ends_a_wait_for_another_process_at_once() {
    for other in ["0.1", "0.2"] {
        let p = slow_out_writer(20);
        let mut holder = spawn_with_lr(&p, "0.1");
        wait_for_first_file(&p);
        // The same key (the node lock), or another key writing the same out.
        let waiter = spawn_with_lr(&p, other);
        std::thread::sleep(Duration::from_millis(800));
        let asked = std::time::Instant::now();
        assert!(std::process::Command::new("kill")
            .args(["-INT", &waiter.id().to_string()])
            .status()
            .unwrap()
            .success());
        let out = waiter.wait_with_output().unwrap();
        let took = asked.elapsed();
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(took < Duration::from_secs(5), "LR={other}: the waiting run took {took:?} to stop after Ctrl-C");
        assert_eq!(out.status.code(), Some(130), "{}{}", stdout(&out), common::stderr(&out));
        let ev = common::events(&out);
        assert!(ev.iter().any(|e| e["event"] == "waiting"), "LR={other}: it never waited: {}", stdout(&out));
        assert!(nodes_with(&ev, "cache_hit").is_empty() && nodes_with(&ev, "node_finished").is_empty(), "{ev:?}");
    }
}

/// Before, `reindex` took a node record as it found it: one whose hash
/// inputs had been edited (here d's command, `echo delta` → `echo DELTA`)
/// was indexed under the key it claimed, so the next run served d's stored
/// result for inputs it was never computed from. A record is re-keyed from
/// its own hash inputs now, as `pull` re-keys a remote one, and one that
/// does not give its key is left out, saying so; its node runs again.
#[test]
fn reindex_leaves_out_a_record_whose_hash_inputs_do_not_give_its_key() {
    let p = Project::new();
    p.write("spec.yaml", common::CHAIN);
    assert_eq!(p.run(&["run", "spec.yaml"]).status.code(), Some(0));
    let ws = p.path().join(".orchestrate");
    std::fs::rename(ws.join("cache.sqlite"), ws.join("cache.sqlite.damaged")).unwrap();
    for side in ["cache.sqlite-wal", "cache.sqlite-shm"] {
        let _ = std::fs::remove_file(ws.join(side));
    }
    let mut edited = 0;
    for journal in std::fs::read_dir(ws.join("records")).unwrap() {
        let path = journal.unwrap().path();
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let now = text.replace("echo delta > d.txt", "echo DELTA > d.txt");
        edited += usize::from(now != text);
        std::fs::write(&path, now).unwrap();
    }
    assert_eq!(edited, 1, "d's record is in one journal");
    reindex_leaves_d_out_and_a_run_makes_it_again(&p, "hash inputs give key");
}

/// `reindex` indexes the chain's a, b and c again and leaves d out, saying
/// `why`; the next run takes a, b and c from the cache and runs d again.
fn reindex_leaves_d_out_and_a_run_makes_it_again(p: &Project, why: &str) {
    let out = p.run(&["reindex"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", common::stderr(&out));
    assert!(text.contains("3 nodes re-indexed") && text.contains("1 left out"), "{text}");
    assert!(text.contains("'d'") && text.contains(why), "{text}");
    let ev = p.run_json(&["spec.yaml"], 0);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["a", "b", "c"]);
    assert_eq!(nodes_with(&ev, "node_finished"), ["d"]);
}
