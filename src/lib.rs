//! orchestrate: reproducible, auditable GRPO post-training experiments.
//!
//! A YAML spec ([`spec`]) compiles into a content-hashed DAG ([`dag`]); the
//! scheduler ([`exec`]) runs each node's op ([`ops`]) and publishes its outputs
//! into a content-addressed store ([`store`]). See `docs/` for the design.
//!
//! This library never calls libtorch: code that does lives under `src/torch/`
//! and is compiled into the `orchestrate-torch` worker binary only (see
//! [`runtime`] for why).

pub mod canonical;
pub mod cli;
pub mod dag;
pub mod data;
pub mod exec;
pub mod gate;
pub mod guard;
pub mod model;
pub mod ops;
pub mod pack;
pub mod report;
pub mod runtime;
pub mod spec;
pub mod store;
pub mod suggest;
pub mod train;
