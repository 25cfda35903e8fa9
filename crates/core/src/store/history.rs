//! Runs of cache hits alone, kept beside the index until it is next written.
//!
//! Recording a run in SQLite was a fifth of a 200-node no-op re-run's time
//! (1.9 of 9.0 ms): its first write makes the WAL and syncs its header and
//! folder, and the last connection's close checkpoints it (two more fsyncs).
//! A run whose every node was a cache hit changes no cache row, so its history
//! (the run, its node outcomes and its events: a [`PendingRun`]) is appended
//! instead as one JSON line to `cache.sqlite-runs`, beside the index, under a
//! shared `flock`. The next run with work, `append_event`, or a run of hits
//! that finds the file over [`FOLD_AT`] folds its lines into the index in one
//! transaction under an exclusive `flock`, then empties it. Every reader of
//! the history reads both (a run in the file first), so `status`, `events`,
//! the report and packs see such a run at once, from a read-only workspace
//! too.
//!
//! Only in WAL mode (a local filesystem), whose commits are not synced either
//! (`synchronous = NORMAL`): the file is as durable as the index's own last
//! commits, and a line a power loss tore is left out. The history of such a
//! run never holds a failure or a cache row, so the reads that ask for those
//! (`last_failure`, `latest_for_node`) need not look here.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::index::{RunNodeRow, RunRow};
use super::{io, StoreError};

/// The size past which a run of hits folds the file into the index (about a
/// dozen runs of 200 nodes).
pub(super) const FOLD_AT: u64 = 1 << 20;

/// The largest file read: the runs folded at [`FOLD_AT`] never make one
/// this large; anything larger is refused, not read into memory.
const MAX_BYTES: u64 = 256 << 20;

/// A finished run of cache hits alone, as one line of the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PendingRun {
    /// Its row, finished (`finished_at`, `status` and `summary` set).
    pub run: RunRow,
    pub argv: String,
    pub pid: u32,
    pub nodes: Vec<RunNodeRow>,
    /// `(seq, event JSON)`, as the events table keeps them.
    pub events: Vec<(u64, String)>,
}

/// The file beside an index at `db`.
pub(super) fn path_for(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-runs");
    PathBuf::from(name)
}

/// Holds an `flock` until dropped (closing the file releases it).
struct Locked(File);

fn lock(file: File, how: libc::c_int, path: &Path) -> Result<Locked, StoreError> {
    loop {
        // SAFETY: flock on a descriptor `file` owns.
        if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
            return Ok(Locked(file));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(StoreError::Io { context: format!("locking {}", path.display()), source: e });
        }
    }
}

/// Opens the file (to append to it where `write`), never through a link,
/// refusing anything but a regular file; `None` where there is none and
/// `create` is false.
fn open(path: &Path, write: bool, create: bool) -> Result<Option<File>, StoreError> {
    let opened = OpenOptions::new()
        .read(true)
        .append(write)
        .create(create)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
        Err(e) => return Err(StoreError::Io { context: format!("opening {}", path.display()), source: e }),
    };
    let meta = file.metadata().map_err(io(format!("reading {}", path.display())))?;
    if !meta.is_file() {
        return Err(StoreError::Invalid(format!(
            "{} is not a regular file: the workspace's own files are never opened through a link. Remove it and \
             run again",
            path.display()
        )));
    }
    Ok(Some(file))
}

/// Appends a run (one `write` of one line, under a shared lock, so a fold
/// never empties the file between another process's read and its truncation)
/// and says the file's size after it.
pub(super) fn append(path: &Path, run: &PendingRun) -> Result<u64, StoreError> {
    let mut line = serde_json::to_vec(run).expect("a run's history serializes");
    line.push(b'\n');
    let file = open(path, true, true)?.expect("created");
    let mut held = lock(file, libc::LOCK_SH, path)?;
    held.0.write_all(&line).map_err(io(format!("appending a run to {}", path.display())))?;
    Ok(held.0.metadata().map_err(io(format!("reading {}", path.display())))?.len())
}

fn read_runs(file: &mut File, path: &Path) -> Result<Vec<PendingRun>, StoreError> {
    let len = file.metadata().map_err(io(format!("reading {}", path.display())))?.len();
    if len > MAX_BYTES {
        return Err(StoreError::Invalid(format!(
            "{} is {len} bytes, more than the {MAX_BYTES} bytes of runs it may hold: it was not written by \
             orchestrate. Remove it (the runs it records are lost from the history, nothing else) and run again",
            path.display()
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_BYTES).read_to_end(&mut bytes).map_err(io(format!("reading {}", path.display())))?;
    // A line a power loss tore (or cut short) does not parse, and is left out.
    Ok(bytes.split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect())
}

/// The runs the file holds, oldest first (none where there is no file).
pub(super) fn read(path: &Path) -> Result<Vec<PendingRun>, StoreError> {
    let Some(file) = open(path, false, false)? else { return Ok(Vec::new()) };
    let mut held = lock(file, libc::LOCK_SH, path)?;
    read_runs(&mut held.0, path)
}

/// Hands the file's runs to `commit` under an exclusive lock and empties the
/// file once it has returned `Ok` (a fold that fails leaves every line in
/// place; one that commits and is then killed leaves lines that fold again,
/// idempotently). Nothing to do where there is no file or it is empty.
pub(super) fn fold(
    path: &Path,
    commit: impl FnOnce(&[PendingRun]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let Some(file) = open(path, true, false)? else { return Ok(()) };
    if file.metadata().map_err(io(format!("reading {}", path.display())))?.len() == 0 {
        return Ok(());
    }
    let mut held = lock(file, libc::LOCK_EX, path)?;
    let runs = read_runs(&mut held.0, path)?;
    commit(&runs)?;
    held.0.set_len(0).map_err(io(format!("emptying {}", path.display())))
}
