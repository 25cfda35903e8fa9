//! A node's identity: its [`Key`], and the record it is computed from
//! ([`HashInputs`]: op, params, input hashes, files, environment). Below the
//! store, which files cache rows, locks and logs under a key and keeps each
//! key's record typed; how a record is built from a DAG node is the DAG's
//! business (`dag::key`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Text that is not a node key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a node key (64 lowercase hex digits)")]
pub struct KeyError(pub String);

/// A node key: 64 lowercase hex digits, the identity a cache row, a lock, a
/// log and a Slurm ticket are filed under. How a key is computed is the DAG's
/// business ([`HashInputs::key`]); the store only knows its shape, and
/// refuses anything else where a key comes from outside (a command line, a
/// ticket, a row), so a key can never name a path outside the workspace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Key(String);

impl Key {
    /// Checks the shape of a key from outside.
    pub fn parse(text: &str) -> Result<Key, KeyError> {
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            Ok(Key(text.to_string()))
        } else {
            Err(KeyError(text.to_string()))
        }
    }

    /// A key from a digest just computed (64 hex digits by construction).
    pub fn from_digest(hash: blake3::Hash) -> Key {
        Key(hash.to_hex().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 digits, as shown to people.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl std::ops::Deref for Key {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&self.0)
    }
}

impl TryFrom<String> for Key {
    type Error = KeyError;
    fn try_from(text: String) -> Result<Key, KeyError> {
        Key::parse(&text)
    }
}

impl From<Key> for String {
    fn from(key: Key) -> String {
        key.0
    }
}

impl rusqlite::types::ToSql for Key {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.0.as_str().into())
    }
}

impl rusqlite::types::FromSql for Key {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        Key::parse(value.as_str()?).map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

/// The numerical environment a result depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvPart {
    /// `cpu` or `cuda`.
    pub device: String,
    pub libtorch: String,
    /// libtorch's CPU capability (`AVX512`, `AVX2`, `DEFAULT`): the same libtorch
    /// computes other bytes with other vectorized kernels. Absent only in records
    /// written before orchestrate keyed it; every environment computed now has it
    /// (see `runtime::cpu_capability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// The processor's vendor (`GenuineIntel`, `AuthenticAMD`): MKL picks its
    /// kernels by vendor too. Absent only in records from before it was keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_vendor: Option<String>,
    /// libtorch's intra-op CPU threads (`ORCHESTRATE_THREADS`, 1 by default): a
    /// sum split over other threads is added in another order, so the same
    /// libtorch computes other bytes with another count. Absent only in records
    /// from before it was keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

/// Everything a node key is computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HashInputs {
    pub op: String,
    pub op_version: u32,
    pub params: Value,
    pub inputs: BTreeMap<String, Vec<String>>,
    pub files: BTreeMap<String, String>,
    /// Folder and glob deps: for each dep as written (`data/prepared`,
    /// `data/*.jsonl`), the blake3 of each file it holds or matches, by path
    /// relative to the folder (a glob's: to the spec's folder). Absent when
    /// empty, so records without such deps keep their keys.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trees: BTreeMap<String, BTreeMap<String, String>>,
    /// Params files: for each file (`params.yaml`), the value of each key the
    /// node names (`train.lr` → `0.01`); the rest of the file is not in the
    /// key, as DVC's `params:`. Absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params_files: BTreeMap<String, BTreeMap<String, Value>>,
    /// Interpreters of the node's programs (a reward program's `python3`):
    /// the first line `INTERPRETER --version` prints. Absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub interpreters: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvPart>,
}

/// The prefix of the input name that a file dep another node writes
/// becomes (`dep:data/prepared.jsonl`).
pub const FILE_DEP_PREFIX: &str = "dep:";

impl HashInputs {
    /// The blake3 this record keys for file dep `rel` (relative to the spec's
    /// folder): of the user's file, or of the output of the node that writes
    /// it. What an op that reads the file itself, and a pack that copies it,
    /// check their bytes against.
    pub fn file_dep_hash(&self, rel: &str) -> Option<&str> {
        self.files
            .get(rel)
            .or_else(|| self.inputs.get(&format!("{FILE_DEP_PREFIX}{rel}")).and_then(|h| h.first()))
            .map(String::as_str)
    }
}

const DOMAIN: &str = "orchestrate.node-key.v1\n";

#[cfg(test)]
impl HashInputs {
    /// A shell node's record with no params, inputs or files: for tests
    /// that need a record and do not look inside it.
    pub(crate) fn empty_shell() -> HashInputs {
        HashInputs {
            op: "shell".into(),
            op_version: 1,
            params: Value::Null,
            inputs: Default::default(),
            files: Default::default(),
            trees: Default::default(),
            params_files: Default::default(),
            interpreters: Default::default(),
            env: None,
        }
    }
}

impl HashInputs {
    /// The node key: 64 hex digits.
    pub fn key(&self) -> Key {
        let record = serde_json::to_value(self).expect("HashInputs serializes to JSON");
        let mut hasher = blake3::Hasher::new();
        hasher.update(DOMAIN.as_bytes());
        hasher.update(crate::canonical::canonical_json(&record).as_bytes());
        Key::from_digest(hasher.finalize())
    }
}
