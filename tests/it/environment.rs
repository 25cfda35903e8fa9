//! The numerical environment in node keys: libtorch's CPU capability, as
//! libtorch itself reports it, and a cache that never serves bytes computed
//! with other CPU kernels; the worker's answer cached until what it depends on
//! changes.

use crate::common;

use std::process::Command;

use common::{stderr, stdout, tiny_spec, Project};

/// `orchestrate env`'s `cpu` line under this `ATEN_CPU_CAPABILITY` (None: unset).
fn ours(requested: Option<&str>) -> String {
    let mut cmd = Command::new(common::bin());
    cmd.arg("env");
    match requested {
        Some(r) => cmd.env("ATEN_CPU_CAPABILITY", r),
        None => cmd.env_remove("ATEN_CPU_CAPABILITY"),
    };
    let out = cmd.output().expect("orchestrate env runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text.lines().find(|l| l.starts_with("cpu ")).unwrap_or_else(|| panic!("no cpu line in:\n{text}"));
    line.split_whitespace().nth(1).expect("a capability").to_string()
}

/// What the venv's PyTorch (the same libtorch build) says.
fn torch(requested: Option<&str>) -> String {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"]);
    match requested {
        Some(r) => cmd.env("ATEN_CPU_CAPABILITY", r),
        None => cmd.env_remove("ATEN_CPU_CAPABILITY"),
    };
    let out = cmd.output().expect("python runs");
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

/// A capability this machine does not pick by itself.
fn another(detected: &str) -> &'static str {
    if detected == "DEFAULT" {
        "avx2"
    } else {
        "default"
    }
}

#[cfg(feature = "torch")]
#[test]
fn the_keyed_cpu_capability_is_what_libtorch_itself_reports() {
    let detected = ours(None);
    let mut cases = vec![None, Some("default"), Some("not-a-capability"), Some(another(&detected))];
    if detected == "AVX512" {
        cases.push(Some("avx2"));
    }
    for requested in cases {
        assert_eq!(ours(requested), torch(requested), "ATEN_CPU_CAPABILITY={requested:?}");
    }
}

#[cfg(feature = "torch")]
#[test]
fn a_node_cached_with_other_cpu_kernels_runs_again_and_plan_says_why() {
    let p = Project::new();
    p.write("t.yaml", &tiny_spec("cpu-kinds", ""));
    p.run_json(&["t.yaml"], 0);
    let detected = ours(None);
    let other = another(&detected);
    let out = p.cmd(&["plan", "t.yaml"]).env("ATEN_CPU_CAPABILITY", other).output().unwrap();
    let text = stdout(&out);
    // Data and tokenizer are not numerical and stay cached; the model is keyed on the kernels.
    assert!(text.lines().any(|l| l.starts_with("tokenizer") && l.contains("cached")), "{text}");
    let expected = format!("env.cpu: \"{detected}\" → \"{}\"", other.to_uppercase());
    assert!(text.lines().any(|l| l.starts_with("base") && l.contains(&expected)), "{text}");
    // And without the override, the same machine is a cache hit.
    let out = p.cmd(&["plan", "t.yaml"]).env_remove("ATEN_CPU_CAPABILITY").output().unwrap();
    assert!(stdout(&out).contains("3 cached, 0 to run"), "{}", stdout(&out));
}

/// A stand-in worker that answers `env --json` and counts how often it was asked.
fn counting_worker(p: &Project) -> std::path::PathBuf {
    let script = p.write(
        "worker.sh",
        "#!/bin/sh\necho asked >> \"$(dirname \"$0\")/asked\"\n\
         echo '{\"device\":\"cpu\",\"libtorch\":\"9.9.9\",\"cpu\":\"AVX2\",\"cpu_vendor\":\"Test\"}'\n",
    );
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    script
}

fn env_with(p: &Project, worker: &std::path::Path, cuda: &str) -> String {
    let out = p
        .cmd(&["env"])
        .env("ORCHESTRATE_WORKER", worker)
        .env("ORCHESTRATE_CACHE", p.path().join("cache"))
        .env("CUDA_VISIBLE_DEVICES", cuda)
        .env_remove("ORCHESTRATE_ENV_CACHE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn the_worker_environment_is_asked_once_until_what_it_depends_on_changes() {
    let p = Project::new();
    let worker = counting_worker(&p);
    let asked = || p.read("asked").lines().count();
    assert!(env_with(&p, &worker, "0").contains("libtorch 9.9.9"));
    assert!(env_with(&p, &worker, "0").contains("libtorch 9.9.9"));
    assert_eq!(asked(), 1, "the second run is served from the cache");
    // Another GPU selection may see another device: asked again.
    env_with(&p, &worker, "1");
    assert_eq!(asked(), 2);
    // A rebuilt worker (new bytes, new mtime) is asked again.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let text = std::fs::read_to_string(&worker).unwrap();
    std::fs::write(&worker, text.replace("9.9.9", "9.9.10")).unwrap();
    assert!(env_with(&p, &worker, "0").contains("libtorch 9.9.10"));
    assert_eq!(asked(), 3);
}

#[test]
fn a_reinstalled_libtorch_is_asked_again_though_the_worker_did_not_change() {
    let p = Project::new();
    let lib = p.path().join("torch-lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libtorch_cpu.so"), "one build").unwrap();
    // The worker's answer names the folder of the libtorch it loads.
    let script = p.write(
        "worker.sh",
        &format!(
            "#!/bin/sh\necho asked >> \"$(dirname \"$0\")/asked\"\n\
             echo '{{\"device\":\"cpu\",\"libtorch\":\"9.9.9\",\"cpu\":\"AVX2\",\"cpu_vendor\":\"Test\",\"libtorch_lib\":\"{}\"}}'\n",
            lib.display()
        ),
    );
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    let asked = || p.read("asked").lines().count();
    env_with(&p, &script, "0");
    env_with(&p, &script, "0");
    assert_eq!(asked(), 1, "served from the cache while the libraries are unchanged");
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(lib.join("libtorch_cpu.so"), "another build").unwrap();
    env_with(&p, &script, "0");
    assert_eq!(asked(), 2, "a changed libtorch library is a miss");
}
