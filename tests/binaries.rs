//! The CLI must not load libtorch (the worker's side: crates/torch/tests/binaries.rs).

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
