//! What a pack's `MANIFEST.json` and `events.jsonl` hold: one type for the
//! writer (`pack freeze`) and every reader (`pack verify`, `audit`, the
//! report). A missing or ill-typed field is an error naming the file and the
//! field, never a default; fields that older packs lack are `Option`s that
//! say "undefined" explicitly.

use crate::store::Key;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::required;
use crate::spec::OutputRef;
use crate::store::OutputKind;

/// The pack format this build writes and reads.
pub const FORMAT: &str = "orchestrate-pack/1";

/// A manifest larger than this is not read (a pack's manifest lists nodes and
/// hashes; it is kilobytes to a few megabytes).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub spec: SpecInfo,
    pub nodes: Vec<PackedNode>,
    pub gates: Vec<PackedGate>,
    pub events: EventsInfo,
    /// Each GRPO lineage's sealed guard log (absent from packs frozen before
    /// they were packed, and from packs without GRPO nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guard: Vec<PackedChain>,
    pub environment: Environment,
    pub frozen_at: String,
    pub options: FreezeRecord,
}

/// A GRPO lineage's guard log as frozen from the workspace's ledger: every
/// stored event of the chain, one a line (`guard::ledger::StoredEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedChain {
    pub lineage: String,
    /// The packed nodes that logged it (an interrupt and its resume share one).
    pub nodes: Vec<String>,
    /// Relative to the pack's folder: `guard/<lineage>.jsonl`.
    pub file: String,
    pub events: usize,
    pub last_seal: String,
}

/// The spec the pack was frozen from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecInfo {
    pub name: String,
    pub path: PathBuf,
    #[serde(deserialize_with = "required")]
    pub profile: Option<String>,
    /// The spec after profiles and overrides, as it ran.
    pub resolved: Value,
}

/// One node of the pack, with its key, the record the key was computed from,
/// and its outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedNode {
    pub id: String,
    pub op: String,
    pub op_version: u32,
    pub key: Key,
    pub inputs: BTreeMap<String, Vec<OutputRef>>,
    /// The node's hash-input record (its key is `hash_inputs.key()`).
    pub hash_inputs: crate::record::HashInputs,
    pub outputs: Vec<PackedOutput>,
    pub finished_at: String,
    /// What its process cost, from its record (absent where the record has
    /// none, and in packs frozen before costs moved there: their metrics hold them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<crate::costs::NodeCosts>,
}

/// One output of a packed node: copied into the pack (`path`), or listed with
/// its hash only (`omitted` says why).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedOutput {
    pub name: String,
    pub blake3: String,
    pub size: u64,
    pub kind: OutputKind,
    /// Relative to the pack's folder.
    #[serde(deserialize_with = "required")]
    pub path: Option<String>,
    #[serde(deserialize_with = "required")]
    pub omitted: Option<String>,
}

/// A gate node: its definition file in the pack, its results, and the packed
/// file of each piece of evidence (`NODE:OUTPUT` → path in the pack).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedGate {
    pub node: String,
    pub definition: String,
    #[serde(deserialize_with = "required")]
    pub results: Option<String>,
    pub evidence: BTreeMap<String, String>,
}

/// The sealed event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsInfo {
    /// The run whose events were sealed (`None`: the spec never ran in that workspace).
    #[serde(deserialize_with = "required")]
    pub run_id: Option<String>,
    pub file: String,
    pub last_seal: String,
}

/// Where the pack's results were computed. `None` is "not recorded": a spec
/// without numerical nodes, or a pack frozen before the field existed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    pub orchestrate_version: String,
    #[serde(deserialize_with = "required")]
    pub git_commit: Option<String>,
    #[serde(deserialize_with = "required")]
    pub libtorch: Option<String>,
    #[serde(deserialize_with = "required")]
    pub device: Option<String>,
    /// Recorded since packs key the CPU capability (absent from v0.1.0 packs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_capability: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// libtorch's CPU threads per numerical node (absent from packs frozen
    /// before it was keyed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    pub os: String,
}

/// The options the pack was frozen with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeRecord {
    pub with_models: bool,
    pub with_states: bool,
    pub max_output_bytes: u64,
}

/// One line of `events.jsonl`: an engine event, chained to the one before by
/// its seal (blake3 over the previous seal, the position and the event's
/// canonical JSON). The event stays the JSON that was sealed; read it as an
/// [`Event`](crate::exec::Event) with [`SealedEvent::engine_event`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedEvent {
    pub seq: usize,
    pub prev: String,
    pub event: Value,
    pub seal: String,
}

impl SealedEvent {
    pub fn engine_event(&self) -> Result<crate::exec::Event, ManifestError> {
        serde_json::from_value(self.event.clone()).map_err(|source| ManifestError::Event { seq: self.seq, source })
    }
}

impl Manifest {
    /// Reads `MANIFEST.json` of a pack folder: a regular file (not a link),
    /// at most [`MAX_MANIFEST_BYTES`], of this format.
    pub fn read(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join("MANIFEST.json");
        let text = crate::fsread::read_bounded_text(&path, MAX_MANIFEST_BYTES)?;
        let manifest: Manifest =
            crate::canonical::parse_typed(&text, &path).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        if manifest.format != FORMAT {
            return Err(ManifestError::Format { path, found: manifest.format });
        }
        Ok(manifest)
    }
}

/// Why a pack's manifest or one of its sealed events did not read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A link, not a file, or over [`MAX_MANIFEST_BYTES`].
    #[error(transparent)]
    File(#[from] crate::fsread::BoundedFileError),
    /// What the strict reader said (the file and the field).
    #[error("{0}")]
    Invalid(String),
    #[error("{}: field format: '{found}', but this orchestrate reads '{FORMAT}'", .path.display())]
    Format { path: PathBuf, found: String },
    #[error("event {seq}: {source}")]
    Event {
        seq: usize,
        #[source]
        source: serde_json::Error,
    },
}
