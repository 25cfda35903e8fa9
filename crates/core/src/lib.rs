//! orchestrate-core: the engine of orchestrate, reproducible and auditable
//! GRPO post-training experiments.
//!
//! A YAML spec ([`spec`]) compiles into a content-hashed DAG ([`dag`]); the
//! scheduler ([`exec`]) runs each node's op ([`ops`]) and publishes its outputs
//! into a content-addressed store ([`store`]). See `docs/engine.md` for the
//! layers and the key record.
//!
//! No clap and no libtorch here: the command line is the `orchestrate` binary
//! (the workspace's root package), and code that calls libtorch is the
//! `orchestrate-torch` crate and worker (crates/torch), a separate process (see
//! [`runtime`] for why). The modules are layers, declared below bottom first;
//! a module uses only those declared before it (`tests/layers.rs`).

// The layers, bottom first: a module uses only modules declared before it
// (tests/layers.rs checks it, naming any line that reaches up).

// Foundations: reading files from outside, encodings, names, statistics,
// the network client.
pub mod fsread;
pub mod canonical;
pub mod ids;
pub mod suggest;
pub mod net;
pub mod stats;
pub mod costs;
// A node's identity: its key and the record it is computed from.
pub mod record;
// The content-addressed store and index, and what reads the machine.
pub mod store;
pub mod runtime;
// Inputs: the user's files, data sets, rewards, models; trust and the Hub.
pub mod docfile;
pub mod data;
pub mod reward;
pub mod model;
pub mod trust;
pub mod hub;
// The guarded trainer's contracts: gates, the guard, training records.
pub mod gate;
pub mod guard;
pub mod train;
// What a node does, what a spec says, and the DAG it compiles to.
pub mod ops;
pub mod spec;
pub mod dag;
// Running: remote caches, the scheduler.
pub mod remote;
pub mod exec;
// Release packs, then the read side over runs and packs.
pub mod pack;
pub mod view;

/// The committed example packs (`artifacts/grpo-main-tiny`), which every later
/// orchestrate must still read: the tests that read their files go through here.
#[cfg(test)]
pub(crate) mod example_packs {
    /// Every committed pack, oldest first.
    pub const VERSIONS: [&str; 3] = ["v0.1.0", "v0.2.0", "v0.3.0"];

    fn root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../artifacts/grpo-main-tiny")
    }

    /// A pack's `outputs` folder.
    pub fn outputs(version: &str) -> std::path::PathBuf {
        root().join(version).join("outputs")
    }

    #[test]
    fn every_committed_pack_is_listed() {
        let mut found: Vec<String> =
            std::fs::read_dir(root()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        found.sort();
        assert_eq!(found, VERSIONS, "a pack added under artifacts/grpo-main-tiny goes into VERSIONS");
    }
}
