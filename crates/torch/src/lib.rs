//! Everything that calls libtorch. This module tree is compiled into the
//! `orchestrate-torch` worker binary only, never into the library: if any
//! library code referenced tch, the `orchestrate` binary would load libtorch
//! (~200 ms of static initialisers) at every start. `tests/it/binaries.rs`
//! checks that the CLI does not link it.

// `h = h + a` must not become `h += a`: on a tch `Tensor`, `+=` is the in-place
// `add_`, which overwrites a value autograd saved for the backward pass (the
// GRPO and SFT updates then fail with "modified by an inplace operation").
#![allow(clippy::assign_op_pattern)]

// Layers, bottom first: a module uses only those declared before it
// (crates/core/tests/layers.rs).
pub mod error;
pub mod decoder;
pub mod generate;
pub mod train;
pub mod eval;
pub mod ops;
pub mod bench;
pub mod cli;

use orchestrate_core::dag::key::EnvPart;

/// The environment of this process's libtorch: what numerical node keys include.
pub fn env() -> error::Result<EnvPart> {
    // An unusable ORCHESTRATE_DEVICE is an error, never keyed as the CPU.
    let device = match generate::pick_device()? {
        tch::Device::Cuda(_) => "cuda".to_string(),
        _ => "cpu".to_string(),
    };
    Ok(EnvPart {
        device,
        libtorch: env!("ORCHESTRATE_LIBTORCH_VERSION").to_string(),
        cpu: Some(orchestrate_core::runtime::cpu_capability()),
        cpu_vendor: Some(orchestrate_core::runtime::cpu_vendor()),
        threads: Some(tch::get_num_threads().max(1) as usize),
    })
}

/// Large allocations reuse freed memory instead of taking fresh pages from the
/// kernel, for the rest of this process. Returns whether it did (glibc, and the
/// user set no `malloc` tunable of their own in `GLIBC_TUNABLES`).
///
/// glibc serves every allocation over its mmap threshold (32 MiB at most) with
/// a `mmap` of its own and unmaps it when freed, so each large temporary of a
/// forward or backward pass (logits over the vocabulary, their gradients,
/// activations) comes as new pages that the kernel zeroes on first touch. At
/// Qwen2.5-0.5B's shapes on a CPU that zeroing (`clear_page_erms`) was about a
/// sixth of a GRPO iteration, in PyTorch eager as in ours. Here those
/// allocations come from the heap instead (`M_MMAP_MAX` 0), and freed memory
/// stays there for the next one (`M_TRIM_THRESHOLD` never reached). Every
/// thread shares the one heap (`M_ARENA_MAX` 1): a thread's own arena cannot
/// hold a block over 64 MiB and glibc would map that one anyway; libtorch's
/// kernels allocate little per call, so the shared lock costs nothing seen. What it
/// costs: the worker's resident memory stays at its peak until it exits (it
/// runs one node). Values are unchanged: libtorch aligns every tensor to 64
/// bytes whichever way its memory was obtained.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if user_sets_malloc() {
            return false;
        }
        // SAFETY: mallopt only sets allocator parameters, under glibc's own
        // lock. glibc converts the int to a size_t, so -1 is the largest
        // threshold (its comment in mallopt says negative values wrap so).
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1) == 1
                && libc::mallopt(libc::M_MMAP_MAX, 0) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, -1) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// What [`load_cuda`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaLibrary {
    /// The libtorch this worker runs on has no CUDA half (a CPU-only install).
    NotInstalled,
    /// This machine has no CUDA driver (`libcuda.so.1`), so CUDA could not run:
    /// its libraries are left unloaded.
    NoDriver,
    /// Loaded from this file, beside the libtorch_cpu.so the worker runs on.
    Loaded(std::path::PathBuf),
}

/// Loads libtorch's CUDA half (`libtorch_cuda.so`, and with it cuBLAS, cuDNN,
/// cuFFT, NCCL ...) where a CUDA driver is installed. The worker does not link
/// it: on a machine without a driver those libraries cost every worker start
/// about 160 ms of static initializers and 350 MB of resident memory, for a
/// device that cannot exist there. It must run before anything asks libtorch
/// about CUDA: libtorch settles whether CUDA exists once, at the first question,
/// and the worker's `main` calls it before anything else touches libtorch.
///
/// A driver with a libtorch_cuda.so that will not load is an error, never a
/// silent CPU run: the worker would otherwise key its nodes as CPU nodes.
pub fn load_cuda() -> Result<CudaLibrary, String> {
    load_cuda_with(cuda_driver_installed())
}

/// [`load_cuda`] with the driver's presence given (a test loads the library on
/// a machine without one: libtorch_cuda's initializers need no device).
pub fn load_cuda_with(driver: bool) -> Result<CudaLibrary, String> {
    let Some(dir) = loaded_libtorch_dir() else {
        return Ok(CudaLibrary::NotInstalled);
    };
    let path = dir.join("libtorch_cuda.so");
    if !path.is_file() {
        return Ok(CudaLibrary::NotInstalled);
    }
    if !driver {
        return Ok(CudaLibrary::NoDriver);
    }
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a library path with a NUL byte", path.display()))?;
    // SAFETY: dlopen with a NUL-terminated path; the handle is never closed, so
    // the kernels it registers with libtorch stay valid for the process.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated message owned by libc.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "no reason given".to_string()
            } else {
                std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        return Err(format!(
            "this machine has a CUDA driver (libcuda.so.1), but libtorch's CUDA library {} does not load: {why}",
            path.display()
        ));
    }
    Ok(CudaLibrary::Loaded(path))
}

/// Whether the dynamic loader finds the CUDA driver's library, as the CUDA
/// runtime itself looks for it.
pub fn cuda_driver_installed() -> bool {
    // SAFETY: dlopen with a constant NUL-terminated name; the handle is closed
    // again (the CUDA runtime opens the driver itself when it starts).
    unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
        true
    }
}

/// The folder of the libtorch_cpu.so this process runs on (from the kernel's
/// map of it), so that the CUDA half comes from the same install, whichever way
/// the loader found the first (rpath, `LD_LIBRARY_PATH`).
fn loaded_libtorch_dir() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let path = std::path::Path::new(&line[line.find('/')?..]);
        (path.file_name()? == "libtorch_cpu.so").then(|| path.parent().map(std::path::Path::to_path_buf))?
    })
}

/// Whether the user set glibc's malloc tunables themselves (`GLIBC_TUNABLES`):
/// then [`keep_freed_memory`] leaves theirs as they are.
pub fn user_sets_malloc() -> bool {
    std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."))
}

#[cfg(test)]
pub mod tests;
