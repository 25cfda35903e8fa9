//! Where numerical work runs. The `orchestrate` binary does not link libtorch:
//! loading it costs ~200 ms of relocations at every start (measured with
//! LD_DEBUG=statistics), which would dominate cache-hit runs and `plan`. Nodes
//! and commands that need libtorch run in the sibling `orchestrate-torch`
//! binary, as a separate process, the same seam a cluster executor uses.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use serde::{Deserialize, Serialize};

pub use crate::record::EnvPart;

/// The variable that sets how many CPU threads each numerical node's libtorch uses.
pub const THREADS_VAR: &str = "ORCHESTRATE_THREADS";

/// The most threads a numerical node may ask for (the variable or a node's `threads`).
pub const MAX_THREADS: usize = 1024;

/// Threads per numerical node: `ORCHESTRATE_THREADS`, or 1 when it is unset.
///
/// One, not every core, by default (as Snakemake's `threads`): the scheduler
/// runs up to `cores / threads` numerical nodes at once, and libtorch workers
/// that each start a thread per core on a shared machine wait on each other
/// (two SFT nodes side by side on 2 cores took 40 s with 2 threads each, 8 s
/// with one). The count is keyed, so it must not depend on `--jobs`.
pub fn worker_threads() -> Result<usize, crate::net::EnvVarError> {
    parse_threads(std::env::var(THREADS_VAR).ok().as_deref())
}

#[cfg(test)]
mod threads_tests {
    #[test]
    fn threads_are_one_by_default_and_a_bad_value_is_named() {
        assert_eq!(super::parse_threads(None), Ok(1));
        assert_eq!(super::parse_threads(Some("4")), Ok(4));
        for bad in ["0", "-1", "two", "", "5000"] {
            let e = super::parse_threads(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("ORCHESTRATE_THREADS") && e.contains(bad), "{e}");
        }
        assert!(super::cpu_slots(1) >= 1 && super::cpu_slots(100_000) == 1);
    }
}

fn parse_threads(value: Option<&str>) -> Result<usize, crate::net::EnvVarError> {
    match value {
        None => Ok(1),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
            _ => Err(crate::net::EnvVarError {
                name: THREADS_VAR.to_string(),
                value: format!("{v:?}"),
                expected: format!("a whole number of threads from 1 to {MAX_THREADS}"),
            }),
        },
    }
}

/// The cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// How many numerical nodes may run at once on this machine's CPU with
/// `threads` each: `cores / threads`, at least one.
pub fn cpu_slots(threads: usize) -> usize {
    (cores() / threads.max(1)).max(1)
}

/// Supplies the numerical environment, asked at most once and only if a
/// numerical node is resolved.
pub type EnvProvider = Box<dyn Fn() -> Result<EnvPart, String> + Send + Sync>;

/// Name of the libtorch-linked worker binary, installed next to `orchestrate`.
pub const WORKER: &str = "orchestrate-torch";

/// The worker binary next to the running executable, if it was built.
pub fn worker_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ORCHESTRATE_WORKER") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    // Test binaries live in target/<profile>/deps; the worker one level up.
    [dir.join(WORKER), dir.parent()?.join(WORKER)].into_iter().find(|p| p.is_file())
}

/// Why the worker could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{WORKER} was not found next to orchestrate: build the workspace's crates/torch (scripts/setup.sh, then cargo build)")]
    Missing,
    #[error("starting {}: {source}", .worker.display())]
    Start {
        worker: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// What it answered when asked for its environment, or why it did not.
    #[error("{0}")]
    Env(String),
}

/// The worker binary, or what to do when it was not built.
pub fn require_worker() -> Result<PathBuf, WorkerError> {
    worker_binary().ok_or(WorkerError::Missing)
}

/// Asks the worker for the numerical environment (once per run).
pub fn env_provider() -> EnvProvider {
    Box::new(|| worker_env(false))
}

/// The environment libtorch really sees here: the device (`cuda` or `cpu`),
/// whatever `ORCHESTRATE_DEVICE` asks for, and the CPU capability.
pub fn probe_env() -> Result<EnvPart, WorkerError> {
    worker_env(true).map_err(WorkerError::Env)
}

/// `orchestrate-torch env --json`, with or without this process's `ORCHESTRATE_DEVICE`,
/// served from the per-user env cache when nothing it depends on changed.
///
/// Starting the worker costs ~300 ms (libtorch's static initializers), which
/// would be most of a fully cached run. Its answer depends only on the worker
/// binary, the libtorch it loads, the host and boot (drivers, GPUs), and a few
/// variables; the cache file is named after a blake3 of all of them (see
/// [`env_fingerprint`]), so any change asks the worker again.
fn worker_env(ignore_device_choice: bool) -> Result<EnvPart, String> {
    let worker = require_worker().map_err(|e| e.to_string())?;
    let cached =
        env_cache_dir().map(|dir| dir.join(format!("{}.json", env_fingerprint(&worker, ignore_device_choice))));
    let entry: Option<CachedEnv> =
        cached.as_ref().and_then(|p| std::fs::read(p).ok()).and_then(|b| serde_json::from_slice(&b).ok());
    // The libtorch the worker loads is only known from the worker's own answer:
    // the entry keeps its files' stat, and a rebuilt or reinstalled one misses.
    if let Some(entry) = entry.filter(|e| e.libs == libs_fingerprint(e.libtorch_lib.as_deref())) {
        return Ok(entry.env);
    }
    let answer = ask_worker(&worker, ignore_device_choice)?;
    let entry = CachedEnv {
        libs: libs_fingerprint(answer.libtorch_lib.as_deref()),
        env: answer.env,
        libtorch_lib: answer.libtorch_lib,
    };
    if let (Some(path), Ok(bytes)) = (cached, serde_json::to_vec(&entry)) {
        // A cache that cannot be written only costs the next run a worker start.
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
            prune_env_cache(dir);
        }
        let _ = crate::store::write_atomic(&path, &bytes);
    }
    Ok(entry.env)
}

/// What `orchestrate-torch env --json` prints: the keyed environment, and the
/// folder of the libtorch libraries the worker was linked against (its rpath).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerEnv {
    #[serde(flatten)]
    pub env: EnvPart,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libtorch_lib: Option<PathBuf>,
}

/// An entry of the per-user env cache.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CachedEnv {
    env: EnvPart,
    libtorch_lib: Option<PathBuf>,
    /// [`libs_fingerprint`] of `libtorch_lib` when the worker answered.
    libs: String,
}

fn stat_into(h: &mut blake3::Hasher, path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    h.update(path.as_os_str().as_encoded_bytes());
    match std::fs::metadata(path) {
        Ok(m) => {
            for n in [m.len() as i64, m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec(), m.ino() as i64] {
                h.update(&n.to_le_bytes());
            }
        }
        Err(_) => {
            h.update(b"absent");
        }
    }
    h.update(b"\0");
}

/// The libtorch libraries in `lib` (path, size, mtime, ctime, inode).
fn libs_fingerprint(lib: Option<&std::path::Path>) -> String {
    let mut h = blake3::Hasher::new();
    if let Some(lib) = lib {
        for name in ["libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so", "libc10.so", "libc10_cuda.so"] {
            stat_into(&mut h, &lib.join(name));
        }
    }
    h.finalize().to_hex().to_string()
}

/// Each rebuild of the worker leaves an entry behind; on a miss, entries unused
/// (unread and unwritten) for a week go.
fn prune_env_cache(dir: &std::path::Path) {
    let week = std::time::Duration::from_secs(7 * 24 * 3600);
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.accessed().or_else(|_| m.modified()))
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > week);
        if old && entry.path().extension().is_some_and(|e| e == "json") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// `${ORCHESTRATE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/orchestrate}/worker-env`, the
/// per-user cache folder scripts/setup.sh uses too; `ORCHESTRATE_ENV_CACHE=off`
/// disables it.
fn env_cache_dir() -> Option<PathBuf> {
    if std::env::var("ORCHESTRATE_ENV_CACHE").is_ok_and(|v| v == "off") {
        return None;
    }
    let root = match std::env::var_os("ORCHESTRATE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("XDG_CACHE_HOME") {
            Some(dir) => PathBuf::from(dir).join("orchestrate"),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".cache").join("orchestrate"),
        },
    };
    Some(root.join("worker-env"))
}

/// Everything the worker's `env` answer depends on, but its libtorch (checked
/// against the entry, see [`worker_env`]): the worker binary (path, size, mtime,
/// ctime, inode: a rebuilt one differs), the host and its boot (GPUs and
/// drivers), the NVIDIA driver version, the variables that change what libtorch
/// sees, and whether `ORCHESTRATE_DEVICE` is honoured.
fn env_fingerprint(worker: &std::path::Path, ignore_device_choice: bool) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"orchestrate.worker-env.v3\0");
    stat_into(&mut h, worker);
    for path in ["/proc/sys/kernel/hostname", "/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version"] {
        h.update(&std::fs::read(path).unwrap_or_default());
        h.update(b"\0");
    }
    for var in [
        "ORCHESTRATE_DEVICE",
        "CUDA_VISIBLE_DEVICES",
        "ATEN_CPU_CAPABILITY",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        THREADS_VAR,
    ] {
        let value = if var == "ORCHESTRATE_DEVICE" && ignore_device_choice { None } else { std::env::var_os(var) };
        h.update(value.as_ref().map_or(&b"unset"[..], |v| v.as_encoded_bytes()));
        h.update(b"\0");
    }
    h.update(&[ignore_device_choice as u8]);
    h.finalize().to_hex().to_string()
}

/// Starts the worker and reads its `env --json`.
fn ask_worker(worker: &std::path::Path, ignore_device_choice: bool) -> Result<WorkerEnv, String> {
    let mut cmd = Command::new(worker);
    cmd.args(["env", "--json"]);
    if ignore_device_choice {
        cmd.env_remove("ORCHESTRATE_DEVICE");
    }
    let out = cmd.output().map_err(|e| format!("starting {}: {e}", worker.display()))?;
    if !out.status.success() {
        return Err(format!("{} env failed: {}", worker.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{} env printed unexpected output: {e}", worker.display()))
}

/// The CPU kernel family libtorch's ATen dispatches to on this machine:
/// `AVX512`, `AVX2` or `DEFAULT` on x86-64, as `torch.backends.cpu.get_cpu_capability()`
/// reports it. The same libtorch picks other vectorized kernels (and so other
/// rounding) on an AVX2 and an AVX-512 processor, so numerical node keys include it.
///
/// This mirrors ATen's `compute_cpu_capability` (aten/src/ATen/native/DispatchStub.cpp)
/// rather than asking libtorch, so the CLI can key nodes without loading it: an
/// `ATEN_CPU_CAPABILITY` of `avx512`, `avx2` or `default` is taken as is, any other
/// value is ignored (ATen warns), and otherwise AVX512 needs AVX-512 VL, BW, DQ and
/// FMA, AVX2 needs AVX2 and FMA. A test checks it against the venv's torch.
pub fn cpu_capability() -> String {
    cpu_capability_for(std::env::var("ATEN_CPU_CAPABILITY").ok().as_deref(), detected_cpu_capability())
}

/// The processor's vendor as CPUID reports it (`GenuineIntel`, `AuthenticAMD`).
/// Keyed beside the capability: MKL, which libtorch calls for matrix products,
/// picks its kernels by vendor as well as by instruction set, so an Intel and an
/// AMD processor of one capability are not assumed to compute the same bytes.
pub fn cpu_vendor() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 processor.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx].iter().flat_map(|w| w.to_le_bytes()).collect();
        String::from_utf8_lossy(&bytes).trim_matches(char::from(0)).trim().to_string()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// The processor's model name (`/proc/cpuinfo`), for the record: not keyed.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn cpu_capability_for(requested: Option<&str>, detected: &str) -> String {
    match requested {
        Some("avx512") if cfg!(target_arch = "x86_64") => "AVX512".to_string(),
        Some("avx2") if cfg!(target_arch = "x86_64") => "AVX2".to_string(),
        Some("default") => "DEFAULT".to_string(),
        _ => detected.to_string(),
    }
}

#[cfg(target_arch = "x86_64")]
fn detected_cpu_capability() -> &'static str {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512vl") && has!("avx512bw") && has!("avx512dq") && has!("fma") {
        "AVX512"
    } else if has!("avx2") && has!("fma") {
        "AVX2"
    } else {
        "DEFAULT"
    }
}

/// Elsewhere ATen's choice (e.g. SVE256 on some aarch64) is not mirrored: the
/// architecture itself is keyed, so caches of different kinds never mix.
#[cfg(not(target_arch = "x86_64"))]
fn detected_cpu_capability() -> &'static str {
    concat!("undetected-", std::env::consts::ARCH)
}

/// Runs a worker command with this process's stdio and returns its exit code.
pub fn exec_worker(args: &[String]) -> Result<ExitCode, WorkerError> {
    let worker = require_worker()?;
    let status = match Command::new(&worker).args(args).status() {
        Ok(status) => status,
        Err(source) => return Err(WorkerError::Start { worker, source }),
    };
    Ok(ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requested_capability_wins_and_an_unknown_one_is_ignored_as_aten_does() {
        assert_eq!(cpu_capability_for(Some("default"), "AVX2"), "DEFAULT");
        assert_eq!(cpu_capability_for(Some("bogus"), "AVX2"), "AVX2");
        assert_eq!(cpu_capability_for(Some("AVX2"), "DEFAULT"), "DEFAULT", "ATen compares case-sensitively");
        assert_eq!(cpu_capability_for(None, "AVX512"), "AVX512");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(cpu_capability_for(Some("avx2"), "AVX512"), "AVX2");
            assert_eq!(cpu_capability_for(Some("avx512"), "AVX2"), "AVX512");
        }
    }

    #[test]
    fn the_vendor_is_the_one_proc_cpuinfo_names() {
        let Ok(text) = std::fs::read_to_string("/proc/cpuinfo") else { return };
        let Some(line) = text.lines().find(|l| l.starts_with("vendor_id")) else { return };
        assert_eq!(cpu_vendor(), line.split_once(':').map(|(_, v)| v.trim()).unwrap_or_default());
    }
}
