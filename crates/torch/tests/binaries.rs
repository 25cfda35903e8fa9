//! The worker links libtorch's CPU half, and loads its CUDA half at run time
//! where a CUDA driver is installed (crates/torch/src/lib.rs, `load_cuda`).

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
fn the_worker_links_libtorch_but_not_its_cuda_half() {
    let libs = needed(env!("CARGO_BIN_EXE_orchestrate-torch"));
    assert!(libs.iter().any(|l| l == "libtorch_cpu.so"), "{libs:?}");
    // Linked, CUDA's libraries (cuBLAS, cuDNN, NCCL ...) cost every worker start
    // about 160 ms and 350 MB, on machines where CUDA cannot run at all.
    assert!(!libs.iter().any(|l| l.starts_with("libtorch_cuda")), "{libs:?}");
}

/// The dynamic loader's own account (`LD_DEBUG=files`) of what a worker start
/// opened: libtorch_cuda exactly where a driver is installed and this libtorch has it.
#[test]
fn the_worker_loads_libtorch_cuda_only_where_a_cuda_driver_is_installed() {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrate-torch"))
        .args(["env", "--json"])
        .env("LD_DEBUG", "files")
        .env_remove("ORCHESTRATE_DEVICE")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let opened = |name: &str| log.lines().any(|l| l.contains("calling init: ") && l.contains(name));
    assert!(opened("libtorch_cpu.so"), "the loader's log names no libtorch_cpu.so: LD_DEBUG had no effect?");
    let installed = std::path::Path::new(env!("ORCHESTRATE_LIBTORCH_LIB")).join("libtorch_cuda.so").exists();
    let driver = orchestrate_torch::cuda_driver_installed();
    let expected = installed && driver;
    assert_eq!(
        opened("libtorch_cuda.so"),
        expected,
        "libtorch_cuda.so in this libtorch: {installed}; CUDA driver here: {driver}"
    );
}
