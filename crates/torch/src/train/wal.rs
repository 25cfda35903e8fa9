//! The update write-ahead log's checkpoints: PREPARED and APPLIED are guard
//! events; then a full state is written to `iter-K.state` (CHECKPOINTED, an
//! atomic rename) and promoted by atomically replacing `committed.json`
//! (COMMITTED). After a crash at any phase, a re-run restores the last
//! committed checkpoint. Failpoints (`ORCHESTRATE_FAILPOINT=phase@iteration`)
//! abort the worker at a phase, for tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::Result;
use orchestrate_core::train::state::StateFile;
use serde_json::{json, Value};
use tch::Tensor;

use super::adamw::AdamW;
use super::common::{read, save_state};

pub struct Wal {
    dir: PathBuf,
}

/// Aborts the process when `ORCHESTRATE_FAILPOINT` names this phase and iteration.
pub fn failpoint(phase: &str, iteration: usize) {
    if std::env::var("ORCHESTRATE_FAILPOINT").ok().as_deref() == Some(&format!("{phase}@{iteration}")) {
        eprintln!("failpoint {phase}@{iteration}: aborting");
        std::process::abort();
    }
}

impl Wal {
    pub fn new(workspace: &std::path::Path, key: &str) -> Self {
        Wal { dir: workspace.join("checkpoints").join(key) }
    }

    /// The state of the last committed checkpoint, if any.
    pub fn last_committed(&self) -> Result<Option<StateFile>> {
        let pointer = self.dir.join("committed.json");
        let Ok(text) = std::fs::read_to_string(&pointer) else { return Ok(None) };
        let v: Value = serde_json::from_str(&text)?;
        let file = self.dir.join(v["checkpoint"].as_str().unwrap_or_default());
        Ok(Some(read(&file)?))
    }

    /// CHECKPOINTED then COMMITTED for the state after `iteration`.
    pub fn checkpoint(
        &self,
        params: &BTreeMap<String, Tensor>,
        adam: &AdamW,
        meta: &Value,
        iteration: usize,
    ) -> Result<()> {
        // Real folders of the workspace's own; a link there is refused, never followed.
        for dir in [self.dir.parent().unwrap_or(&self.dir), &self.dir] {
            orchestrate_core::store::fsx::own_dir(dir)
                .map_err(|e| crate::error::Error::Msg(format!("checkpoint folder: {e}")))?;
        }
        let name = format!("iter-{}.state", iteration + 1);
        save_state(&self.dir.join(&name), params, adam, meta)?;
        failpoint("checkpointed", iteration);
        let tmp = self.dir.join("committed.json.partial");
        std::fs::write(&tmp, json!({"checkpoint": name}).to_string())?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, self.dir.join("committed.json"))?;
        failpoint("committed", iteration);
        Ok(())
    }

    pub fn clear(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
