//! The update write-ahead log's checkpoints: PREPARED and APPLIED are guard
//! events; then a full state is written to `iter-K.state` (CHECKPOINTED, an
//! atomic rename) and promoted by atomically replacing `committed.json`
//! (COMMITTED). After a crash at any phase, a re-run restores the last
//! committed checkpoint. Failpoints (`ORCHESTRATE_FAILPOINT=phase@iteration`)
//! abort the worker at a phase, for tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::{bail, err, Result};
use serde_json::Value;
use tch::Tensor;

use super::adamw::AdamW;
use super::common::save_state;

/// The file naming the last committed checkpoint.
const POINTER: &str = "committed.json";

/// What [`POINTER`] holds.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Committed {
    /// The checkpoint's file name in the folder: `iter-N.state`.
    checkpoint: String,
}

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

    /// The state file of the last committed checkpoint, if any: a file
    /// `iter-N.state` in this folder (the pointer is refused otherwise).
    pub fn last_committed(&self) -> Result<Option<PathBuf>> {
        let pointer = self.dir.join(POINTER);
        let text = match std::fs::read_to_string(&pointer) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => bail!("{}: {e}", pointer.display()),
        };
        let committed: Committed =
            serde_json::from_str(&text).map_err(|e| err!("{}: not a commit pointer: {e}", pointer.display()))?;
        let number = committed.checkpoint.strip_prefix("iter-").and_then(|n| n.strip_suffix(".state"));
        if !number.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            bail!("{}: checkpoint '{}' is not a name iter-N.state", pointer.display(), committed.checkpoint);
        }
        Ok(Some(self.dir.join(committed.checkpoint)))
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
        // A link there is an error, never written through.
        let mut pointer = orchestrate_core::store::fsx::open_truncate(&tmp)?;
        std::io::Write::write_all(&mut pointer, serde_json::to_string(&Committed { checkpoint: name })?.as_bytes())?;
        pointer.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(POINTER))?;
        failpoint("committed", iteration);
        Ok(())
    }

    pub fn clear(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commit pointer names a checkpoint in its own folder: one naming a
    /// path elsewhere is refused, never read.
    #[test]
    fn the_commit_pointer_names_a_checkpoint_of_its_own_folder_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), "k");
        assert_eq!(wal.last_committed().unwrap(), None);
        std::fs::create_dir_all(&wal.dir).unwrap();
        let pointer = wal.dir.join(POINTER);
        std::fs::write(&pointer, r#"{"checkpoint": "iter-12.state"}"#).unwrap();
        assert_eq!(wal.last_committed().unwrap(), Some(wal.dir.join("iter-12.state")));
        for bad in [r#"{"checkpoint": "../../../etc/passwd"}"#, r#"{"checkpoint": "iter-.state"}"#, r#"{}"#, "x"] {
            std::fs::write(&pointer, bad).unwrap();
            let e = wal.last_committed().unwrap_err().to_string();
            assert!(e.contains("committed.json"), "{bad}: {e}");
        }
    }

    /// A link planted where a checkpoint writes its state or its pointer is
    /// refused: the checkpoint fails, and what the link points to is untouched.
    #[test]
    fn a_checkpoint_never_writes_through_a_link() {
        use crate::train::adamw::AdamWConfig;
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs.txt");
        std::fs::write(&theirs, "keep").unwrap();
        let params: BTreeMap<String, Tensor> = [("w".to_string(), Tensor::from_slice(&[1.0f32, 2.0]))].into();
        let adam = AdamW::new(AdamWConfig::new(0.0), &params);
        let meta = serde_json::json!({"kind": "test"});
        for planted in ["iter-1.partial", "committed.json.partial"] {
            let wal = Wal::new(&dir.path().join(planted), "k");
            std::fs::create_dir_all(&wal.dir).unwrap();
            std::os::unix::fs::symlink(&theirs, wal.dir.join(planted)).unwrap();
            assert!(wal.checkpoint(&params, &adam, &meta, 0).is_err(), "{planted}: written through a link");
            assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "keep", "{planted}");
            assert!(wal.last_committed().unwrap().is_none(), "{planted}: nothing committed");
        }
    }
}
