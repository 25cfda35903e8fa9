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

/// A machine with a CUDA driver library but no GPU it can use (a container
/// with the driver mounted, a driver too old for this libtorch): a stub
/// `libcuda.so.1` that exports nothing stands in for it. The worker then takes
/// the path it takes on a GPU machine up to the driver (it finds the driver and
/// loads libtorch's CUDA half beside its CPU half), runs on the CPU when no
/// device is asked for, and refuses `ORCHESTRATE_DEVICE=cuda` saying why.
#[test]
fn with_a_cuda_driver_but_no_usable_gpu_the_worker_loads_the_cuda_half_and_runs_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("libcuda.so.1");
    let mut cc = Command::new("cc")
        .args(["-shared", "-x", "c", "-", "-o"])
        .arg(&stub)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("a C compiler (cc) is installed: cargo links with it");
    std::io::Write::write_all(&mut cc.stdin.take().unwrap(), b"int orchestrate_stub_cuda_driver;\n").unwrap();
    assert!(cc.wait().unwrap().success(), "cc could not build the stub driver");
    let library_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(rest) if !rest.is_empty() => format!("{}:{rest}", dir.path().display()),
        _ => dir.path().display().to_string(),
    };
    let worker = |device: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrate-torch"));
        c.args(["env", "--json"]).env("LD_LIBRARY_PATH", &library_path).env("LD_DEBUG", "files");
        match device {
            Some(d) => c.env("ORCHESTRATE_DEVICE", d),
            None => c.env_remove("ORCHESTRATE_DEVICE"),
        };
        c.output().unwrap()
    };

    let out = worker(None);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let opened = |name: &str| log.lines().any(|l| l.contains("calling init: ") && l.contains(name));
    assert!(opened(&stub.display().to_string()), "the worker did not find the stub driver:\n{log}");
    let installed = std::path::Path::new(env!("ORCHESTRATE_LIBTORCH_LIB")).join("libtorch_cuda.so").exists();
    assert_eq!(opened("libtorch_cuda.so"), installed, "libtorch_cuda.so in this libtorch: {installed}");
    let env: orchestrate_core::runtime::WorkerEnv =
        serde_json::from_slice(&out.stdout).expect("env --json prints the worker's environment");
    assert_eq!(env.env.device, "cpu", "{env:?}");

    let asked = worker(Some("cuda"));
    let said = String::from_utf8_lossy(&asked.stderr);
    assert_eq!(asked.status.code(), Some(2), "{said}");
    assert!(said.contains("ORCHESTRATE_DEVICE=cuda: libtorch sees no CUDA device"), "{said}");
}
