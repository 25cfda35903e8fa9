//! The CLI must not load libtorch (the worker's side: crates/torch/tests/binaries.rs).

use crate::common;

use std::process::Command;

fn needed(binary: &str) -> Vec<String> {
    let out = Command::new("readelf").args(["-d", binary]).output().expect("readelf (binutils) is installed");
    assert!(out.status.success(), "readelf failed on {binary}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1).map(|s| s.trim_end_matches(']').to_string()))
        .collect()
}

#[test]
fn the_cli_does_not_link_libtorch() {
    let libs = needed(env!("CARGO_BIN_EXE_orchestrate"));
    assert!(
        !libs.iter().any(|l| l.contains("torch") || l.contains("c10")),
        "orchestrate links {libs:?}: some library code reaches tch; move it under crates/torch/src/"
    );
}

#[cfg(feature = "torch")]
#[test]
fn env_reports_the_pinned_libtorch_through_the_worker() {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrate")).arg("env").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("libtorch 2.11.0"), "{text}");
    assert!(text.contains("device   cpu") || text.contains("device   cuda"), "{text}");
}

/// `orchestrate env` with `var` unset, or set to `value`.
fn env_with(var: &str, value: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orchestrate"));
    cmd.arg("env").env_remove(var);
    if let Some(v) = value {
        cmd.env(var, v);
    }
    cmd.output().unwrap()
}

#[cfg(feature = "torch")]
#[test]
fn the_worker_uses_and_reports_the_threads_it_is_given() {
    let env_with = |threads: Option<&str>| env_with("ORCHESTRATE_THREADS", threads);
    // libtorch's own count, read back by the worker after setting it.
    let out = env_with(None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("threads  1 per numerical node"));
    let out = env_with(Some("3"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("threads  3 per numerical node"));
    let out = env_with(Some("many"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ORCHESTRATE_THREADS=\"many\"") && err.contains("1 to 1024"), "{err}");
}

/// Asked for CUDA where libtorch sees no GPU, the worker refuses, naming the
/// variable, instead of keying results on a device it cannot use (and failing
/// later inside an op with libtorch's own message).
#[cfg(feature = "torch")]
#[test]
fn asking_for_cuda_without_a_gpu_is_a_clear_error() {
    let env = |device: Option<&str>| env_with("ORCHESTRATE_DEVICE", device);
    let plain = env(None);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    if String::from_utf8_lossy(&plain.stdout).contains("device   cuda") {
        // A machine with a GPU: nothing to refuse.
        common::skip("asking_for_cuda_without_a_gpu_is_a_clear_error", "this machine has a CUDA device");
        return;
    }
    for asked in ["cuda", "cuda:0"] {
        let out = env(Some(asked));
        assert!(
            !out.status.success(),
            "ORCHESTRATE_DEVICE={asked} was accepted: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("ORCHESTRATE_DEVICE={asked}")) && err.contains("no CUDA device"), "{err}");
    }
}

/// (Issue #34.) scripts/test.sh's closing line counts a test that announced
/// `SKIPPED:` (through common::skip) as skipped, not passed, and lists it.
#[test]
fn the_closing_line_counts_announced_skips_as_skipped_not_passed() {
    let log = "running 3 tests\nSKIPPED: a test on a small tmpfs (mounting a tmpfs needs root; CI runs as root)\n\
               test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s\n\
               SKIPPED: the Slurm executor test (ORCHESTRATE_SKIP_SLURM_TEST is set)\n\
               test result: FAILED. 4 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("log"), log).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-summary.sh");
    let out = Command::new("bash").arg(script).arg(dir.path().join("log")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("skipped: a test on a small tmpfs (mounting a tmpfs needs root"), "{text}");
    assert_eq!(text.lines().last(), Some("all tests: 5 passed, 2 failed, 3 skipped"), "{text}");
}
