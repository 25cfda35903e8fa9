//! scripts/gpu-check.sh on its CPU fallback (`ORCHESTRATE_DEVICE=cpu`): every
//! step of the GPU check runs, on the tiny shapes, so the script cannot rot
//! between the days a GPU is at hand.

use crate::common;

use std::path::Path;
use std::process::Command;

/// Runs scripts/gpu-check.sh with this build's binaries and `ORCHESTRATE_DEVICE=device`:
/// its exit code and everything it printed.
fn gpu_check(device: &str) -> (Option<i32>, String) {
    let bin_dir = Path::new(common::bin()).parent().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let out = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .env("ORCHESTRATE_DEVICE", device)
        .env("ORCHESTRATE_BIN_DIR", bin_dir)
        .env("ORCHESTRATE_PYTHON", python)
        .env_remove("ORCHESTRATE_THREADS")
        .output()
        .unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_gpu_check_script_runs_every_step_on_its_cpu_fallback() {
    let (code, text) = gpu_check("cpu");
    assert_eq!(code, Some(0), "{text}");
    for step in ["== 1.", "== 2.", "== 3.", "== 4.", "== 5."] {
        assert!(text.contains(step), "step {step} ran: {text}");
    }
    // Both devices are the CPU here: the logits are the same numbers.
    assert!(text.contains("logits max |difference| 0.000e+00"), "{text}");
    assert!(text.contains("greedy: 4 of 4 rows equal"), "{text}");
    // Ours and PyTorch eager both timed, side by side.
    let loop_row = text.lines().find(|l| l.starts_with("loop ")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(loop_row.split_whitespace().count(), 4, "ours, PyTorch and their ratio: {loop_row}");
    assert!(text.contains("warmstart-check: identical = True"), "{text}");
    assert!(text.contains("grpo-check: identical = True"), "{text}");
    assert!(text.contains("gpu-check: all checks passed on cpu"), "{text}");
}

/// Asked for CUDA where the worker sees none, the check fails at step 1 and says so.
#[test]
fn the_gpu_check_fails_when_cuda_is_asked_for_and_absent() {
    let visible = Command::new(common::bin()).args(["env"]).output().unwrap();
    if String::from_utf8_lossy(&visible.stdout).contains("cuda") {
        // This machine has a GPU: the other test's fallback is the one to check.
        common::skip("the_gpu_check_fails_when_cuda_is_asked_for_and_absent", "this machine has a CUDA device");
        return;
    }
    let (code, text) = gpu_check("cuda");
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("FAIL: CUDA was asked for") && text.contains("no CUDA device"), "{text}");
    assert!(!text.contains("== 2."), "nothing runs after a failed step 1: {text}");
}
