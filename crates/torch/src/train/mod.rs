//! Training: AdamW, the GRPO objective and updates, and (in `loops`) the SFT
//! and GRPO runs with resumable state.

pub mod adamw;
pub mod common;
pub mod grpo;
pub mod guarded;
pub mod objective;
pub mod replay;
pub mod sft;
pub mod update;
pub mod wal;

#[cfg(test)]
mod tests;
