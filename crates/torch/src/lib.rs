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

/// Whether the user set glibc's malloc tunables themselves (`GLIBC_TUNABLES`):
/// then [`keep_freed_memory`] leaves theirs as they are.
pub fn user_sets_malloc() -> bool {
    std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."))
}

#[cfg(test)]
pub mod tests;
