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

#[cfg(test)]
pub mod tests;
