//! Training: AdamW, the GRPO objective and updates, the guard's rollout
//! engine, the write-ahead log, and the SFT and GRPO runs with resumable state.

// Layers, bottom first: a module uses only those declared before it
// (crates/core/tests/layers.rs).
pub mod adamw;
pub mod objective;
pub mod common;
pub mod update;
pub mod guarded;
pub mod wal;
pub mod sft;
pub mod grpo;
pub mod replay;

#[cfg(test)]
mod tests;
