//! The update write-ahead log's checkpoints: PREPARED and APPLIED are guard
//! events; then a full state is written to `iter-K.state` (CHECKPOINTED, an
//! atomic rename) and promoted by atomically replacing `committed.json`
//! (COMMITTED). After a crash at any phase, a re-run restores the last
//! committed checkpoint. Failpoints (`ORCHESTRATE_FAILPOINT=phase@iteration`)
//! abort the worker at a phase, for tests.
//!
//! A checkpoint also keeps the rollouts of the iterations it covers (the
//! node's `rollouts` output is written in a staging folder that a crash
//! loses): the attempt that recovers the checkpoint puts them back, so its
//! output is the uncrashed run's, byte for byte.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{bail, err, Result};
use orchestrate_core::guard::rollouts;
use orchestrate_core::train::metrics::TrainingMetrics;
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
    /// The node's `rollouts` output in its staging folder.
    rollouts: PathBuf,
    /// The first iteration whose rollouts the WAL does not keep yet.
    kept_from: Cell<usize>,
}

/// The WAL's copy of the rollouts, in its folder.
const ROLLOUTS: &str = "rollouts";

/// Aborts the process when `ORCHESTRATE_FAILPOINT` names this phase and iteration.
pub fn failpoint(phase: &str, iteration: usize) {
    if std::env::var("ORCHESTRATE_FAILPOINT").ok().as_deref() == Some(&format!("{phase}@{iteration}")) {
        eprintln!("failpoint {phase}@{iteration}: aborting");
        std::process::abort();
    }
}

impl Wal {
    /// The WAL in `dir` (the executor's [`WorkerJob::checkpoints`]), keeping
    /// the rollouts written in `rollouts` (the staging folder's output) from
    /// iteration `start` on.
    ///
    /// [`WorkerJob::checkpoints`]: orchestrate_core::ops::worker::WorkerJob::checkpoints
    pub fn new(dir: &Path, rollouts: &Path, start: usize) -> Self {
        Wal { dir: dir.to_path_buf(), rollouts: rollouts.to_path_buf(), kept_from: Cell::new(start) }
    }

    /// After the committed checkpoint that ends before iteration `next` was
    /// restored: the rollouts of iterations `from..next`, kept with it, go
    /// back into the output (each checked as it is read).
    pub fn recover_rollouts(&self, from: usize, next: usize) -> Result<()> {
        rollouts::copy_iterations(&self.dir.join(ROLLOUTS), &self.rollouts, from..next, rollouts::write_iteration)
            .map_err(|e| err!("the committed checkpoint's rollouts: {e}"))?;
        self.kept_from.set(next);
        Ok(())
    }

    /// Keeps the rollouts of the iterations up to `iteration` that the WAL
    /// does not hold yet: each file read and checked, then written beside the
    /// checkpoints under a temporary name, synced and renamed (a copy an
    /// earlier attempt left there is replaced by this attempt's).
    fn keep_rollouts(&self, iteration: usize) -> Result<()> {
        let kept = self.dir.join(ROLLOUTS);
        rollouts::ensure_dir(&kept).map_err(|e| err!("checkpoint folder: {e}"))?;
        let iterations = self.kept_from.get()..=iteration;
        rollouts::copy_iterations(&self.rollouts, &kept, iterations, rollouts::replace_iteration)
            .map_err(|e| err!("keeping the rollouts with the checkpoint: {e}"))?;
        self.kept_from.set(iteration + 1);
        Ok(())
    }

    /// The state file of the last committed checkpoint, if any: a file
    /// `iter-N.state` in this folder (the pointer is refused otherwise).
    pub fn last_committed(&self) -> Result<Option<PathBuf>> {
        // Nothing is read through a link planted at the WAL's folder.
        match std::fs::symlink_metadata(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Ok(m) if !m.is_dir() => bail!(
                "{} is a symbolic link (or not a folder) where orchestrate keeps a node's checkpoints: \
                 it never reads through one; remove it and run again",
                self.dir.display()
            ),
            _ => {}
        }
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
        meta: &TrainingMetrics,
        iteration: usize,
    ) -> Result<()> {
        // Real folders of the workspace's own; a link there is refused, never followed.
        for dir in [self.dir.parent().unwrap_or(&self.dir), &self.dir] {
            orchestrate_core::store::fsx::own_dir(dir)
                .map_err(|e| crate::error::Error::Msg(format!("checkpoint folder: {e}")))?;
        }
        self.keep_rollouts(iteration)?;
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
        let wal = Wal::new(&dir.path().join("checkpoints/k"), dir.path(), 0);
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
        let meta = crate::train::common::tests::meta(0);
        let staged = dir.path().join("staged");
        rollouts::ensure_dir(&staged).unwrap();
        rollouts::write_iteration(&staged, 0, &[]).unwrap();
        for planted in ["iter-1.partial", "committed.json.partial", "rollouts"] {
            let wal = Wal::new(&dir.path().join(planted).join("checkpoints/k"), &staged, 0);
            std::fs::create_dir_all(&wal.dir).unwrap();
            std::os::unix::fs::symlink(&theirs, wal.dir.join(planted)).unwrap();
            assert!(wal.checkpoint(&params, &adam, &meta, 0).is_err(), "{planted}: written through a link");
            assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "keep", "{planted}");
            assert!(wal.last_committed().unwrap().is_none(), "{planted}: nothing committed");
        }
    }

    /// A committed checkpoint keeps the rollouts of the iterations it covers,
    /// and the attempt that recovers it (a fresh staging folder) gets them
    /// back byte for byte; a kept file that was edited is refused.
    #[test]
    fn a_checkpoint_keeps_its_rollouts_and_a_recovery_puts_them_back() {
        use crate::train::adamw::AdamWConfig;
        use orchestrate_core::guard::TokenArtifacts;
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("first"), dir.path().join("second"));
        rollouts::ensure_dir(&first).unwrap();
        let rollout = |t: i64| TokenArtifacts {
            prompt_ids: vec![1, t],
            response_ids: vec![t],
            old_logprobs: vec![-0.5],
            mask_start: 2,
            mask_len: 1,
        };
        let params: BTreeMap<String, Tensor> = [("w".to_string(), Tensor::from_slice(&[1.0f32]))].into();
        let adam = AdamW::new(AdamWConfig::new(0.0), &params);
        let meta = crate::train::common::tests::meta(0);
        let wal = Wal::new(&dir.path().join("checkpoints/k"), &first, 0);
        for i in 0..2 {
            rollouts::write_iteration(&first, i, &[rollout(i as i64), rollout(7)]).unwrap();
        }
        wal.checkpoint(&params, &adam, &meta, 1).unwrap();
        // A crash: the next attempt's staging folder is new and empty.
        rollouts::ensure_dir(&second).unwrap();
        let again = Wal::new(&dir.path().join("checkpoints/k"), &second, 0);
        again.recover_rollouts(0, 2).unwrap();
        for i in 0..2 {
            let name = rollouts::file_name(i);
            assert_eq!(std::fs::read(first.join(&name)).unwrap(), std::fs::read(second.join(&name)).unwrap());
        }
        // This attempt's own iteration 2 is kept at its checkpoint, not 0 and 1 again.
        rollouts::write_iteration(&second, 2, &[rollout(2)]).unwrap();
        again.checkpoint(&params, &adam, &meta, 2).unwrap();
        assert!(wal.dir.join(ROLLOUTS).join(rollouts::file_name(2)).is_file());
        // An edited kept file is refused on recovery, naming it.
        let kept = wal.dir.join(ROLLOUTS).join(rollouts::file_name(0));
        std::fs::write(&kept, "{\"prompt_ids\": 1}\n").unwrap();
        let third = dir.path().join("third");
        rollouts::ensure_dir(&third).unwrap();
        let e = Wal::new(&dir.path().join("checkpoints/k"), &third, 0).recover_rollouts(0, 3).unwrap_err().to_string();
        assert!(e.contains(&rollouts::file_name(0)) && e.contains("line 1"), "{e}");
    }

    /// A recovery reads nothing through a link: a link planted at the WAL's
    /// folder or at its kept rollouts (to a folder holding a crafted
    /// pointer and rollouts) is an error naming it, and nothing is read.
    #[test]
    fn a_recovery_never_reads_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::write(theirs.join(POINTER), r#"{"checkpoint": "iter-1.state"}"#).unwrap();
        rollouts::write_iteration(&theirs, 0, &[]).unwrap();
        let staged = dir.path().join("staged");
        rollouts::ensure_dir(&staged).unwrap();
        // The WAL's folder is a link.
        std::fs::create_dir(dir.path().join("checkpoints")).unwrap();
        let linked = dir.path().join("checkpoints/k");
        std::os::unix::fs::symlink(&theirs, &linked).unwrap();
        let wal = Wal::new(&linked, &staged, 0);
        let e = wal.last_committed().unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // Its kept rollouts are a link.
        let real = dir.path().join("checkpoints/real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&theirs, real.join(ROLLOUTS)).unwrap();
        let e = Wal::new(&real, &staged, 0).recover_rollouts(0, 1).unwrap_err().to_string();
        assert!(e.contains("not a link"), "{e}");
        assert!(!staged.join(rollouts::file_name(0)).exists(), "nothing was copied from their folder");
    }
}
