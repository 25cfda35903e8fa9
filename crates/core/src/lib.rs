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
//! [`runtime`] for why). The modules form layers without a cycle
//! (`tests/layers.rs` fails on a new one).

pub mod canonical;
pub mod compare;
pub mod costs;
pub mod dag;
pub mod data;
pub mod docfile;
pub mod exec;
pub mod gate;
pub mod guard;
pub mod hub;
pub mod ids;
pub mod model;
pub mod net;
pub mod ops;
pub mod overlay;
pub mod pack;
pub mod remote;
pub mod report;
pub mod reward;
pub mod runtime;
pub mod spec;
pub mod stats;
pub mod store;
pub mod suggest;
pub mod tensorboard;
pub mod train;
pub mod trust;

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
