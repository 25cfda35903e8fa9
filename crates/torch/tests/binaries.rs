//! The worker links libtorch, with CUDA kept linked when the install has it.

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
fn the_worker_links_libtorch_and_keeps_cuda_when_the_install_has_it() {
    let libs = needed(env!("CARGO_BIN_EXE_orchestrate-torch"));
    assert!(libs.iter().any(|l| l == "libtorch_cpu.so"), "{libs:?}");
    let torch_lib = std::path::Path::new(env!("ORCHESTRATE_LIBTORCH_LIB"));
    if torch_lib.join("libtorch_cuda.so").exists() {
        assert!(libs.iter().any(|l| l == "libtorch_cuda.so"), "CUDA would silently be unavailable: {libs:?}");
    }
}
