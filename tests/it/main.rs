//! The integration tests, one binary (as ripgrep's `tests/` are): it links
//! once instead of once per file. Each module is one area, a former
//! `tests/NAME.rs`; run one with `cargo test --test it NAME::`.

mod common;

mod binaries;
mod caching;
mod compare;
mod crash_and_concurrency;
mod data;
mod e1_e2;
mod environment;
mod events;
mod experiments;
mod export;
mod fault_matrix;
mod gpu_check;
mod guard;
mod hardening;
mod hub;
mod model;
mod packs;
mod pipeline;
mod recovery;
mod remote;
mod replay;
mod rollouts;
mod report;
mod schema;
mod slurm;
mod slurm_config;
mod spec_errors;
mod spec_features;
mod store_outputs;
mod streams;
mod targets;
mod trainer;
mod verifier_table;
