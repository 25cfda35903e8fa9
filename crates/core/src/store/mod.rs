//! The workspace: `.orchestrate/` (or `--workspace DIR`) holding
//!
//! - `objects/`: content-addressed, write-once outputs ([`objects`]),
//! - `cache.sqlite`: the index ([`index`]), committed last when a node completes,
//! - `tmp/`: staging for outputs being written, one folder per live process,
//! - `locks/`: one lock file per node key, held with an OS lock, so a killed
//!   process releases it and nothing ever needs a manual unlock,
//! - `logs/`: each node's log by key,
//! - `workspace.json`: the marker that says the folder is a workspace, with its
//!   format version (as `.git/` or DVC's `.dvc/` mark theirs).
//!
//! Only a marked folder (or a new or empty one, which is then marked) is used
//! as a workspace: `--workspace ~` must never clean `~/tmp`. Inside it every
//! folder and file is ours and a link found there is refused, never followed
//! ([`fsx`]); cleanups remove only entries whose names have the form we create.

pub mod fsx;
pub mod gc;
mod history;
pub mod index;
mod journal;
pub mod objects;

use std::collections::BTreeMap;
use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids as spec_ids;

pub use index::{
    open_database, open_database_read_only, CachedNode, FileStat, Index, NodeOutcome, OutputRecord, RunNodeRow,
    RunOutput, RunRow, SpecRef,
};
pub use objects::{hash_file, ObjectInfo};

pub use objects::OutputKind;

/// What is wrong with an object a reader was about to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectProblem {
    #[error("object {short} is missing from the store")]
    Missing { short: String },
    /// Its bytes no longer hash to its name; moved aside where the store is writable.
    #[error(
        "object {short} is damaged: its bytes no longer hash to its name{}",
        .moved_to.as_ref().map(|t| format!(" (moved aside to {})", t.display())).unwrap_or_default()
    )]
    Damaged { short: String, moved_to: Option<PathBuf> },
}

/// Why a cached node's outputs can no longer be trusted as they stand (the
/// node is then checked out of the store again, or run).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputProblem {
    /// The output's object is not in the store (not dropped by gc on purpose).
    #[error("output '{name}' is missing from the store")]
    NotInStore { name: String },
    /// Nothing (or no folder, for a folder out) where the output belongs.
    #[error("output '{path}' is missing")]
    Missing { path: String },
    /// Other bytes than the object's: `what` says how (sizes, files).
    #[error("output '{path}' was modified ({what})")]
    Modified { path: String, what: String },
    /// A folder out that could not be hashed.
    #[error("output '{path}' cannot be checked: {error}")]
    Unreadable { path: String, error: String },
    /// Modified in the tree while checked out as a hard link to its object,
    /// which was therefore edited too.
    #[error("{problem}; it was a hard link to the store, so {damage}")]
    ObjectEdited { problem: Box<OutputProblem>, damage: ObjectProblem },
}

/// The store's error type.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// SQLite's error is in the message, not a separate `source`, so a chain
    /// of causes does not print it twice.
    #[error("{context}: {error}")]
    Db { context: String, error: rusqlite::Error },
    /// A database file SQLite cannot read: said once, with what to do.
    #[error(
        "{} is damaged ({detail}). To go on, move it aside: mv {} {}.damaged. {advice}",
        path.display(),
        path.display(),
        path.display()
    )]
    Damaged { path: PathBuf, detail: String, advice: &'static str },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A wait for another process (a node's or an out's lock) ended by an
    /// interrupt (Ctrl-C) before the lock was free.
    #[error("interrupted while waiting for another orchestrate process ({waiting})")]
    Interrupted { waiting: String },
    /// A stored object to be checked out whose bytes no longer hash to its
    /// name (bit rot, an edit after a chmod): never placed in the tree.
    #[error("node '{node}': out '{out}' was not checked out: {problem}")]
    DamagedObject { node: String, out: String, problem: ObjectProblem },
}

pub use crate::record::{Key, KeyError};

fn not_a_workspace(root: &Path) -> StoreError {
    StoreError::Invalid(format!(
        "{} is not an orchestrate workspace (it has no {MARKER}) and is not empty: refusing to use it, \
         so nothing in it is touched. Give --workspace a new or empty folder, or an existing workspace",
        root.display()
    ))
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

/// Runs `f` holding an OS lock on `lock_path` (created if needed), so
/// processes doing the same at the same moment take turns: how a database's
/// creation (tables, journal mode) is serialized.
pub fn while_locked<T>(lock_path: &Path, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    let lock = fsx::open_lock(lock_path).map_err(io(format!("creating {}", lock_path.display())))?;
    lock.lock().map_err(io(format!("locking {}", lock_path.display())))?;
    f()
}

/// What [`Workspace::reindex`] did.
#[derive(Debug, Default)]
pub struct Reindexed {
    /// The nodes indexed again.
    pub added: Vec<String>,
    /// Records whose key the index already had.
    pub present: usize,
    /// What was left out, and why (its node runs again when a spec needs it).
    pub left_out: Vec<(String, String)>,
}

/// What [`Workspace::verify`] found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Outputs (or, without an index, objects) re-hashed.
    pub checked: usize,
    /// One line each, ready to print.
    pub problems: Vec<String>,
    /// The index was missing: objects were checked one by one, and
    /// `orchestrate reindex` rebuilds it from the records.
    pub index_missing: bool,
}

/// Writes a file whole or not at all: a temporary file beside it (named after
/// this process, so concurrent writers do not meet), synced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // Fresh (O_EXCL), so a link planted at the temporary name is never written through.
    let _ = fs::remove_file(&tmp);
    let mut f = File::create_new(&tmp)?;
    f.write_all(bytes).and_then(|()| objects::sync_file(&f))?;
    fs::rename(&tmp, path)
}

/// Writes a file the user named on the command line (`report --out FILE`).
/// A regular file, a link to one, or nothing there: replaced whole through
/// [`write_atomic`] (never half-written). A special file (a FIFO, a device
/// such as `/dev/null`, or a link to one such as `/dev/stdout`): written
/// into, as `cp` and a shell's `>` write, never replaced, which as root
/// would swap the machine's `/dev/null` for a regular file. A folder: an error.
pub fn write_user_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(std::io::Error::other(format!("{} is a folder; name a file", path.display()))),
        Ok(m) if !m.is_file() => fs::OpenOptions::new().write(true).open(path)?.write_all(bytes),
        _ => write_atomic(path, bytes),
    }
}

/// The last `lines` lines of a file, reading at most its last `max_bytes`
/// (logs can be large); `None` if it cannot be read.
pub fn last_lines(path: &Path, max_bytes: u64, lines: usize) -> Option<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = File::open(path).ok()?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    f.seek(SeekFrom::Start(len.saturating_sub(max_bytes))).ok()?;
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    Some(all[all.len().saturating_sub(lines)..].iter().map(|l| l.to_string()).collect())
}

/// Now as RFC 3339 UTC with milliseconds; for records, never for keys.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// An opened workspace.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    read_only: bool,
    /// The workspace's use lock (`use.lock`), held shared by every process
    /// that opened it to write (a run, a checkout), and exclusively by gc, so
    /// gc never removes what a running process may still read or commit.
    _use_lock: Option<std::sync::Arc<File>>,
    exclusive: bool,
    /// This process's staging root, made on first use and shared by clones.
    staging_root: std::sync::Arc<std::sync::Mutex<Option<std::sync::Arc<StagingRoot>>>>,
    /// The connection [`Workspace::open`] made to create the index, handed to
    /// the first [`Workspace::index`] call instead of opening another.
    spare_index: SpareIndex,
    /// This process's journal of node records, opened at its first commit.
    journal: journal::Journal,
}

/// At most one opened index connection, waiting for its first user.
#[derive(Clone, Default)]
struct SpareIndex(std::sync::Arc<std::sync::Mutex<Option<Index>>>);

impl SpareIndex {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Index>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take(&self) -> Option<Index> {
        self.slot().take()
    }

    /// Keeps `index` for the next user, unless one is kept already.
    fn keep(&self, index: Index) {
        self.slot().get_or_insert(index);
    }
}

impl std::fmt::Debug for SpareIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpareIndex")
    }
}

/// The file whose bytes are the node locks ([`Workspace::lock_node`]).
const NODE_LOCKS: &str = "nodes.lock";

/// The locks on outs in the user's tree, one byte per out's real path
/// (see [`Workspace::lock_outs`]).
const OUT_LOCKS: &str = "outs.lock";

/// Where in [`NODE_LOCKS`] a key's lock byte is: 60 bits of the key's blake3.
fn node_lock_offset(key: &str) -> i64 {
    let hash = blake3::hash(key.as_bytes());
    let bytes: [u8; 8] = hash.as_bytes()[..8].try_into().expect("8 bytes");
    (u64::from_le_bytes(bytes) >> 4) as i64
}

/// Takes byte `at` of the lock file `file`. If another open of it holds the
/// byte, `waiting` is called once (to say so), then this waits: blocked in
/// the kernel when there is no `stop`, else polling until `stop` says to
/// give up (`Ok(false)`; a blocked wait cannot be ended from another thread).
fn take_lock_byte(
    file: &fs::File,
    at: i64,
    waiting: impl FnOnce(),
    stop: Option<&dyn Fn() -> bool>,
) -> std::io::Result<bool> {
    if fsx::lock_byte(file, at, false)? {
        return Ok(true);
    }
    waiting();
    match stop {
        None => fsx::lock_byte(file, at, true),
        Some(stop) => fsx::lock_byte_until(file, at, stop),
    }
}

/// A held node lock; released on drop or when the process dies.
pub struct NodeLock {
    _files: Vec<File>,
}

/// A staging folder for one node's in-flight outputs, inside its process's
/// [`StagingRoot`]; removed on drop, and with the root by the next process
/// if this one was killed (the root's lock is gone then).
pub struct Staging {
    dir: PathBuf,
    _root: std::sync::Arc<StagingRoot>,
}

impl Staging {
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    /// Empties the folder and hands it back to its root for the next node
    /// (a node that published moved its outputs out: nothing to remove);
    /// a folder that cannot be emptied is removed whole.
    fn drop(&mut self) {
        // Checked first: a link put in the folder's place is removed as a
        // link, never listed through (that emptied the folder it points to).
        let real_dir = fs::symlink_metadata(&self.dir).is_ok_and(|m| m.is_dir());
        let emptied = real_dir
            && fs::read_dir(&self.dir)
                .and_then(|entries| entries.map(|e| e.map(|e| e.path())).collect::<Result<Vec<_>, _>>())
                .ok()
                .is_some_and(|paths| paths.iter().all(|p| objects::remove_any(p).is_ok()));
        if emptied {
            self._root.free.lock().unwrap_or_else(|p| p.into_inner()).push(std::mem::take(&mut self.dir));
        } else {
            let _ = objects::remove_any(&self.dir);
        }
    }
}

/// One process's folder under `tmp/`, holding its nodes' staging folders,
/// and its lock (`tmp/NAME.lock`, held while the process has it). One per
/// opened workspace rather than a folder and a lock made and removed per
/// node: on ext4 without a journal every file removed makes the next
/// creations scan past its inode for a while, and a 200-node run removed 600.
/// Node folders are reused too: emptied, a finished node's folder is the
/// next node's.
struct StagingRoot {
    dir: PathBuf,
    _lock: File,
    next: std::sync::atomic::AtomicU64,
    free: std::sync::Mutex<Vec<PathBuf>>,
}

impl Drop for StagingRoot {
    fn drop(&mut self) {
        let _ = objects::remove_any(&self.dir);
        let _ = fs::remove_file(self.dir.with_extension("lock"));
    }
}

impl std::fmt::Debug for StagingRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingRoot").field("dir", &self.dir).finish()
    }
}

/// Which outs a checkout replaces ([`Workspace::restore_outputs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Only those missing from the tree (`pull`).
    Missing,
    /// Missing ones, and those whose bytes in the tree the store holds (`checkout`).
    Stored,
    /// Every one that differs (`run`, and `checkout --force`).
    All,
}

/// What a checkout of one node's outs did.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The node's outputs with the stat of each out checked out.
    pub outputs: Vec<OutputRecord>,
    /// Files and bytes checked out.
    pub files: u64,
    pub bytes: u64,
    /// Outs left as they are: their bytes in the tree are not in the store.
    pub kept: Vec<KeptOut>,
    /// Outs replaced whose bytes the store lacked, and where they were moved.
    pub moved: Vec<MovedOut>,
}

/// An out whose bytes the store lacked, moved into the workspace's trash
/// before its place was taken (never removed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovedOut {
    pub path: String,
    pub to: PathBuf,
}

impl std::fmt::Display for MovedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "out '{}' held bytes the store lacks: moved to {}", self.path, self.to.display())
    }
}

/// An out a checkout left alone, and how it differs from the store's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptOut {
    pub path: String,
    /// `lr.txt changed, extra.txt added`, `size 4 → 15`.
    pub changes: String,
}

/// The file that marks a folder as a workspace.
pub const MARKER: &str = "workspace.json";

/// The workspace's folder of outs set aside ([`Workspace::trash_dir`]).
pub const TRASH: &str = "trash";

/// The workspace format this build reads and writes.
pub const FORMAT: u32 = 1;

/// The marker's contents.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Marker {
    /// The format version of the workspace.
    orchestrate_workspace: u32,
}

/// The folders of a workspace, all ours.
const FOLDERS: [&str; 5] = ["objects", "tmp", "locks", "logs", "records"];

/// What a folder given as a workspace is.
enum Found {
    /// Marked by us (its format checked).
    Marked,
    /// Made by an orchestrate from before the marker: an index or records beside `objects/`.
    Unmarked,
    /// New or empty: safe to make a workspace of.
    Empty,
    /// Anything else: someone's folder, never touched.
    Foreign,
}

/// Whether `dir` is an orchestrate workspace: its marker is a regular file
/// (never read through a link) that reads as one of ours, of any format.
/// A workspace is never data: a dep walk leaves it out, and an out folder
/// holding one is not removed.
pub fn is_workspace(dir: &Path) -> bool {
    crate::fsread::read_bounded_file(&dir.join(MARKER), 4096)
        .is_ok_and(|bytes| serde_json::from_slice::<Marker>(&bytes).is_ok())
}

fn is_marker_tmp(name: &str) -> bool {
    name.starts_with(&format!(".{MARKER}.")) && name.ends_with(".tmp")
}

/// What checking one output against its object found.
enum Checked {
    Same,
    /// The same bytes under a new stat, now recorded in the output.
    Refreshed,
    Differs(OutputProblem),
}

/// The workspace's own files, refused where a link (or anything but a
/// regular file) stands: SQLite follows a link, so a planted
/// `cache.sqlite -> ~/theirs.db` would get our tables, or be read as ours.
fn refuse_linked_files(root: &Path) -> Result<(), StoreError> {
    for file in [
        "cache.sqlite",
        "cache.sqlite-wal",
        "cache.sqlite-shm",
        "cache.sqlite-runs",
        "guard.sqlite",
        "index.lock",
        "use.lock",
    ] {
        let path = root.join(file);
        if fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
            return Err(StoreError::Invalid(format!(
                "{} is a symbolic link or not a regular file: the workspace's own files are never opened \
                 through a link. Remove it and run again",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Writes the marker whole, or finds it written by another process that got
/// there first: a complete temporary file is hard-linked to its name, which
/// fails if the name exists, so no reader ever sees a half-written marker.
fn mark(root: &Path) -> Result<(), StoreError> {
    use std::io::Write;
    let tmp = root.join(format!(".{MARKER}.{}.tmp", objects::unique_suffix()));
    let bytes = serde_json::to_vec(&Marker { orchestrate_workspace: FORMAT }).expect("a marker serializes");
    let mut f = File::create_new(&tmp).map_err(io(format!("marking {}", root.display())))?;
    let written = f.write_all(&bytes).and_then(|()| f.sync_all());
    let linked = written.and_then(|()| match fs::hard_link(&tmp, root.join(MARKER)) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    });
    let _ = fs::remove_file(&tmp);
    linked.map_err(io(format!("marking {}", root.display())))
}

fn examine(root: &Path) -> Result<Found, StoreError> {
    let marker = root.join(MARKER);
    // Read first, checked on the file opened: one open on every command's start.
    use crate::fsread::{read_bounded_file, BoundedFileError};
    match read_bounded_file(&marker, 4096) {
        Ok(bytes) => {
            let found: Marker = serde_json::from_slice(&bytes).map_err(|e| {
                StoreError::Invalid(format!(
                    "{} is not a workspace marker ({e}); expected {{\"orchestrate_workspace\": {FORMAT}}}",
                    marker.display()
                ))
            })?;
            if found.orchestrate_workspace > FORMAT {
                return Err(StoreError::Invalid(format!(
                    "{} is a workspace of format {}, made by a newer orchestrate (this one knows format {FORMAT})",
                    root.display(),
                    found.orchestrate_workspace
                )));
            }
            return Ok(Found::Marked);
        }
        Err(BoundedFileError::NotAFile { .. } | BoundedFileError::TooLarge { .. }) => {
            return Err(StoreError::Invalid(format!(
                "{} is not a regular file of at most 4096 bytes: not a workspace marker (a link is never followed)",
                marker.display()
            )))
        }
        Err(e) if e.is_absent() => {}
        Err(BoundedFileError::Io { source, .. }) => {
            return Err(StoreError::Io { context: format!("reading {}", marker.display()), source })
        }
    }
    let mut entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Empty),
        Err(e) => return Err(StoreError::Io { context: format!("listing {}", root.display()), source: e }),
    };
    // Another process marking this folder at the same moment leaves only its
    // marker's temporary file: still an empty folder. So is one holding only
    // its config file (a remote and trusted keys written before the first run).
    let config_only =
        |name: &str| name == "config.yaml" && fs::symlink_metadata(root.join(name)).is_ok_and(|m| m.is_file());
    if entries.all(|e| {
        e.is_ok_and(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            is_marker_tmp(&name) || config_only(&name)
        })
    }) {
        return Ok(Found::Empty);
    }
    let is = |name: &str, dir: bool| {
        fs::symlink_metadata(root.join(name)).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() })
    };
    if is("objects", true) && (is("cache.sqlite", false) || is("records", true)) {
        return Ok(Found::Unmarked);
    }
    // Another process marked the folder (and began making its folders) after
    // the marker was looked for above: it is a workspace, read its marker.
    if fs::symlink_metadata(&marker).is_ok() {
        return examine(root);
    }
    Ok(Found::Foreign)
}

impl Workspace {
    /// Opens a workspace, creating it if needed, and clears staging left by killed processes.
    ///
    /// A folder that exists, is not empty and is not a workspace is refused
    /// whole, and so is a workspace whose index is missing while its records
    /// are there (`orchestrate reindex` rebuilds it; a new empty index would
    /// make every node run again).
    pub fn open(root: &Path) -> Result<Workspace, StoreError> {
        Self::open_with(root, false, false)
    }

    /// As [`Workspace::open`], but a missing index is made anew (for `reindex`).
    pub fn open_for_reindex(root: &Path) -> Result<Workspace, StoreError> {
        Self::open_with(root, true, false)
    }

    /// As [`Workspace::open`], holding the use lock exclusively (for `gc`):
    /// an error, naming what to do, while any other process has it open.
    pub fn open_exclusive(root: &Path) -> Result<Workspace, StoreError> {
        Self::open_with(root, false, true)
    }

    /// Whether this process alone has the workspace open ([`Workspace::open_exclusive`]).
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    fn take_use_lock(root: &Path, exclusive: bool) -> Result<File, StoreError> {
        let path = root.join("use.lock");
        let file = fsx::open_lock(&path).map_err(io(format!("opening {}", path.display())))?;
        if exclusive {
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(StoreError::Invalid(format!(
                        "another orchestrate process (a run, a checkout, another gc) has the workspace {} open: \
                         gc removes nothing while one does; run it again when that process has finished",
                        root.display()
                    )))
                }
                Err(TryLockError::Error(e)) => {
                    return Err(StoreError::Io { context: format!("locking {}", path.display()), source: e })
                }
            }
        } else {
            // A gc in progress finishes first (it takes seconds, and a run must not read what it removes).
            file.lock_shared().map_err(io(format!("locking {}", path.display())))?;
        }
        Ok(file)
    }

    fn open_with(root: &Path, new_index_ok: bool, exclusive: bool) -> Result<Workspace, StoreError> {
        // Absolute, because ops run in other folders (a shell node runs in its spec's).
        let root = &std::path::absolute(root).map_err(io(format!("resolving {}", root.display())))?;
        if fs::metadata(root).is_ok_and(|m| !m.is_dir()) {
            return Err(StoreError::Invalid(format!(
                "{} is not a folder, so it cannot be a workspace",
                root.display()
            )));
        }
        match examine(root)? {
            Found::Marked => {}
            Found::Empty | Found::Unmarked => {
                fs::create_dir_all(root).map_err(io(format!("creating {}", root.display())))?;
                mark(root)?;
            }
            Found::Foreign => return Err(not_a_workspace(root)),
        }
        for sub in FOLDERS {
            fsx::own_dir(&root.join(sub))?;
        }
        refuse_linked_files(root)?;
        let use_lock = Self::take_use_lock(root, exclusive)?;
        let ws = Workspace {
            root: root.to_path_buf(),
            read_only: false,
            _use_lock: Some(std::sync::Arc::new(use_lock)),
            staging_root: Default::default(),
            journal: Default::default(),
            exclusive,
            spare_index: SpareIndex::default(),
        };
        if !new_index_ok {
            ws.refuse_missing_index()?;
        }
        // Creating the index (tables, WAL mode) is serialized between processes
        // that open a new workspace at the same moment.
        let index = while_locked(&root.join("index.lock"), || ws.index())?;
        ws.spare_index.keep(index);
        ws.clear_dead_staging()?;
        Ok(ws)
    }

    /// Opens an existing workspace without creating or changing anything, or
    /// `None` if there is none yet (no such folder, or an empty one). A folder
    /// that is not a workspace is an error, so a mistyped `--workspace` is said.
    pub fn open_read_only(root: &Path) -> Result<Option<Workspace>, StoreError> {
        let root = &std::path::absolute(root).map_err(io(format!("resolving {}", root.display())))?;
        match examine(root)? {
            Found::Empty => return Ok(None),
            Found::Foreign => return Err(not_a_workspace(root)),
            Found::Marked | Found::Unmarked => {}
        }
        refuse_linked_files(root)?;
        let ws = Workspace {
            root: root.to_path_buf(),
            read_only: true,
            _use_lock: None,
            exclusive: false,
            staging_root: Default::default(),
            journal: Default::default(),
            spare_index: SpareIndex::default(),
        };
        if ws.index_missing() && ws.refuse_missing_index().is_ok() {
            // Marked but nothing recorded yet.
            return Ok(None);
        }
        Ok(Some(ws))
    }

    /// Whether the index file is missing, so only the objects and records are left.
    pub fn index_missing(&self) -> bool {
        fs::symlink_metadata(self.root.join("cache.sqlite")).is_err()
    }

    /// An error when the index is missing while nodes were recorded, saying what to run.
    fn refuse_missing_index(&self) -> Result<(), StoreError> {
        if !self.index_missing() {
            return Ok(());
        }
        let records = fs::read_dir(self.records_dir()).map(|d| d.count()).unwrap_or(0);
        let objects = fs::read_dir(self.objects_dir()).map(|d| d.count()).unwrap_or(0);
        if records == 0 && objects == 0 {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "the workspace {} has objects and node records but its index (cache.sqlite) is missing: \
             run `orchestrate reindex` to rebuild it from the records (`orchestrate verify` checks the objects)",
            self.root.display()
        )))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The run to look at: the given one (which must exist) or the latest.
    pub fn resolve_run(&self, run: Option<String>) -> Result<String, StoreError> {
        let runs = self.index()?.recent_runs(usize::MAX >> 1)?;
        match run {
            Some(r) if runs.iter().any(|x| x.run_id == r) => Ok(r),
            Some(r) => Err(StoreError::Invalid(format!("no run '{r}' in {}", self.root().display()))),
            None => runs.first().map(|r| r.run_id.clone()).ok_or_else(|| StoreError::Invalid("no runs yet".into())),
        }
    }

    /// Where each completed node's record is kept beside its cache row, so
    /// the index can be rebuilt from them ([`Workspace::reindex`]).
    pub fn records_dir(&self) -> PathBuf {
        self.root.join("records")
    }

    /// Where an orchestrate before the journals kept a node's record (see
    /// [`journal`]): still read by reindex and removed by gc.
    fn legacy_record_path(&self, key: &Key) -> PathBuf {
        self.records_dir().join(&key[..2]).join(format!("{key}.json"))
    }

    /// Removes the records of `keys` from the journals (gc, holding the
    /// workspace exclusively): this process's own journal is closed first.
    pub(crate) fn forget_records(&self, keys: &std::collections::BTreeSet<Key>) -> Result<(), StoreError> {
        journal::forget(&self.records_dir(), &self.journal, keys)
    }

    /// The bytes the records of `keys` take in the journals.
    pub(crate) fn record_bytes(&self, keys: &std::collections::BTreeSet<Key>) -> Result<u64, StoreError> {
        journal::bytes_of(&self.records_dir(), keys)
    }

    /// Commits a completed node, whose outputs are published: its record
    /// first (a line of this process's journal; one cut short is left out by
    /// reindex), then its cache row.
    pub fn commit_node(&self, index: &Index, node: &CachedNode) -> Result<(), StoreError> {
        self.write_record(node)?;
        index.insert_node(node)?;
        index.check_still_linked()
    }

    /// Appends a node's record to this process's journal ([`journal`]).
    fn write_record(&self, node: &CachedNode) -> Result<(), StoreError> {
        self.journal.append(&self.records_dir(), node)
    }

    /// Marks one stored output of a committed node as dropped (`why`), in its
    /// record first and then its cache row, as [`Workspace::commit_node`]
    /// orders them, under the node's lock. Its object is left to the caller.
    /// Returns that object (`None`: no such stored output).
    pub fn mark_dropped(
        &self,
        index: &Index,
        key: &Key,
        output: &str,
        why: &str,
    ) -> Result<Option<ObjectInfo>, StoreError> {
        let _lock = self.lock_node(key, || {})?;
        let Some(mut node) = index.lookup(key)? else { return Ok(None) };
        let Some(at) = node.outputs.iter().position(|o| o.name == output && o.stored()) else { return Ok(None) };
        node.outputs[at].dropped = Some(why.to_string());
        self.write_record(&node)?;
        index.update_outputs(&node.key, &node.outputs)?;
        Ok(Some(node.outputs[at].object.clone()))
    }

    /// Drops one stored output of a committed node (`run --drop-states`, once
    /// everything that reads it has finished): [`Workspace::mark_dropped`],
    /// then its object is removed, unless another row still names the same
    /// object stored. Returns the bytes freed (`None`: nothing to drop).
    pub fn drop_output(&self, index: &Index, key: &Key, output: &str, why: &str) -> Result<Option<u64>, StoreError> {
        // A link on the object's way refuses the drop before the row is marked.
        if let Some(node) = index.lookup(key)? {
            if let Some(o) = node.outputs.iter().find(|o| o.name == output && o.stored()) {
                gc::refuse_link(self, &self.object_path(&o.object.hash))?;
            }
        }
        let Some(object) = self.mark_dropped(index, key, output, why)? else { return Ok(None) };
        let shared = index
            .all_nodes()?
            .iter()
            .any(|n| n.key != *key && n.outputs.iter().any(|o| o.stored() && o.object.hash == object.hash));
        if shared {
            return Ok(Some(0));
        }
        objects::remove_any(&self.object_path(&object.hash))?;
        Ok(Some(object.size))
    }

    /// Rebuilds the index's cache rows from the node records: each record
    /// whose key is not in the index, and whose every output object is
    /// present and still hashes to its name, is indexed again. Runs, their
    /// events and the stat cache are not in the records and stay lost.
    pub fn reindex(&self) -> Result<Reindexed, StoreError> {
        let index = self.index()?;
        let mut done = Reindexed::default();
        let dir = self.records_dir();
        // The records: those of an orchestrate before the journals, one file
        // each, then each journal's lines in order.
        let mut files = Vec::new();
        if dir.is_dir() {
            for shard in fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))? {
                let shard = shard.map_err(io(format!("listing {}", dir.display())))?;
                if !shard.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                for f in fs::read_dir(shard.path()).map_err(io(format!("listing {}", shard.path().display())))? {
                    let f = f.map_err(io(format!("listing {}", shard.path().display())))?;
                    let name = f.file_name().to_string_lossy().into_owned();
                    if !name.starts_with('.') {
                        files.push(f.path());
                    }
                }
            }
        }
        files.sort();
        let mut records: Vec<(String, journal::Line)> =
            files.into_iter().map(|path| (path.display().to_string(), self.read_record(&path))).collect();
        for path in journal::journals(&dir)? {
            for (line, record) in journal::read(&path) {
                records.push((format!("{} line {line}", path.display()), record));
            }
        }
        // A key recorded more than once (an output dropped since) is indexed
        // from its latest record whose objects are all there.
        let mut by_key: BTreeMap<Key, Vec<CachedNode>> = BTreeMap::new();
        for (source, record) in records {
            match record {
                Err(why) => done.left_out.push((source, why)),
                Ok(node) => by_key.entry(node.key.clone()).or_default().push(node),
            }
        }
        for (key, mut nodes) in by_key {
            if index.lookup(&key)?.is_some() {
                done.present += 1;
                continue;
            }
            let mut why = None;
            while let Some(node) = nodes.pop() {
                match self.unindexable(&node)? {
                    Some(bad) => {
                        why.get_or_insert((format!("'{}' (key {})", node.node_id, node.key.short()), bad));
                    }
                    None => {
                        index.insert_node(&node)?;
                        done.added.push(node.node_id);
                        why = None;
                        break;
                    }
                }
            }
            done.left_out.extend(why);
        }
        Ok(done)
    }

    /// Why a record cannot be indexed again: an output's object missing or
    /// not hashing to its name (`None`: it can).
    fn unindexable(&self, node: &CachedNode) -> Result<Option<String>, StoreError> {
        // The key is recomputed from the record's own hash inputs (as `pull`
        // does a remote record's): an edited record would otherwise be served
        // for inputs it was never computed from.
        let recomputed = node.record.key();
        if recomputed != node.key {
            return Ok(Some(format!(
                "its hash inputs give key {}, not {}: the record was altered",
                recomputed.short(),
                node.key.short()
            )));
        }
        for out in node.outputs.iter().filter(|o| o.stored()) {
            match objects::intact(&self.object_path(&out.object.hash), &out.object.hash, out.object.kind)? {
                Some(true) => {}
                Some(false) => return Ok(Some(format!("output '{}': its object does not hash to its name", out.name))),
                None => return Ok(Some(format!("output '{}': its object is missing", out.name))),
            }
        }
        Ok(None)
    }

    /// Re-hashes what the store holds: each indexed node's outputs, or, when
    /// the index is missing, every object against its name (so a workspace
    /// that lost its index is still checked, and says how to rebuild it).
    pub fn verify(&self) -> Result<Verified, StoreError> {
        let mut done = Verified { index_missing: self.index_missing(), ..Verified::default() };
        if !done.index_missing {
            for node in self.index()?.all_nodes()? {
                for out in node.outputs.iter().filter(|o| o.stored()) {
                    done.checked += 1;
                    let path = self.object_path(&out.object.hash);
                    match objects::intact(&path, &out.object.hash, out.object.kind)? {
                        Some(true) => {}
                        Some(false) => done.problems.push(format!(
                            "CORRUPT  {} output '{}': object {} no longer hashes to its name",
                            spec_ids::escaped(&node.node_id),
                            spec_ids::escaped(&out.name),
                            out.object.hash
                        )),
                        None => done.problems.push(format!(
                            "MISSING  {} output '{}': object {} is not in the store",
                            spec_ids::escaped(&node.node_id),
                            spec_ids::escaped(&out.name),
                            out.object.hash
                        )),
                    }
                }
            }
            return Ok(done);
        }
        let dir = self.objects_dir();
        let mut found = Vec::new();
        for shard in fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))?.flatten() {
            if !shard.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for object in fs::read_dir(shard.path()).map_err(io(format!("listing {}", shard.path().display())))? {
                found.push(object.map_err(io(format!("listing {}", shard.path().display())))?.path());
            }
        }
        found.sort();
        for path in found {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            done.checked += 1;
            if Key::parse(&name).is_err() {
                done.problems.push(format!("STRAY    {}: not an object's name", spec_ids::escaped(&name)));
                continue;
            }
            let kind = match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => OutputKind::Dir,
                _ => OutputKind::File,
            };
            if objects::intact(&path, &name, kind)? != Some(true) {
                done.problems.push(format!("CORRUPT  object {name} no longer hashes to its name"));
            }
        }
        Ok(done)
    }

    /// A record file, checked: a regular file of bounded size, named after the key it holds.
    fn read_record(&self, path: &Path) -> Result<CachedNode, String> {
        use journal::MAX_RECORD_BYTES;
        let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
        if meta.len() > MAX_RECORD_BYTES {
            return Err(format!("{} bytes, over the limit of {MAX_RECORD_BYTES}", meta.len()));
        }
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let key = Key::parse(&stem).map_err(|e| format!("not a record's name: {e}"))?;
        let bytes = fs::read(path).map_err(|e| e.to_string())?;
        let node: CachedNode = serde_json::from_slice(&bytes).map_err(|e| format!("not a node record: {e}"))?;
        if node.key != key {
            return Err(format!("it holds key {}, not the one it is named after", node.key.short()));
        }
        Ok(node)
    }

    /// Runs `f` on a connection to the index that is kept for the next
    /// [`Workspace::index`] call: a command that asks one question of the
    /// index before its real work does not open two.
    pub fn with_index<T>(&self, f: impl FnOnce(&Index) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let index = self.index()?;
        let answer = f(&index);
        self.spare_index.keep(index);
        answer
    }

    /// This workspace as [`Workspace::open_read_only`] opens it: what reads
    /// through it changes nothing (no stat refreshed, no object set aside).
    pub fn read_only_view(&self) -> Workspace {
        Workspace { read_only: true, spare_index: SpareIndex::default(), ..self.clone() }
    }

    /// A new connection to the index (the first call may get the one
    /// opening the workspace made; it is no one else's).
    pub fn index(&self) -> Result<Index, StoreError> {
        if let Some(index) = self.spare_index.take() {
            return Ok(index);
        }
        let path = self.root.join("cache.sqlite");
        if self.read_only {
            self.refuse_missing_index()?;
            Index::open_read_only(&path)
        } else {
            Index::open(&path)
        }
    }

    pub fn objects_dir(&self) -> PathBuf {
        self.root.join("objects")
    }

    pub fn object_path(&self, hash: &str) -> PathBuf {
        self.objects_dir().join(objects::object_rel(hash))
    }

    /// Where damaged objects are moved aside (see [`Workspace::check_object`]).
    pub fn damaged_dir(&self) -> PathBuf {
        self.root.join("damaged")
    }

    /// Where outs holding bytes the store lacks are moved instead of being
    /// removed ([`Workspace::set_aside_unstored`]); `gc` empties it.
    pub fn trash_dir(&self) -> PathBuf {
        self.root.join(TRASH)
    }

    /// Checks that an object's bytes still hash to its name before anyone
    /// reads it. A damaged object is moved aside into [`Workspace::damaged_dir`]
    /// (so its producer's cache entry no longer checks out and it re-runs) and
    /// the error says where it went; a missing one is an error too.
    pub fn check_object(&self, object: &ObjectInfo) -> Result<Result<(), ObjectProblem>, StoreError> {
        let path = self.object_path(&object.hash);
        let short = object.hash[..object.hash.len().min(12)].to_string();
        Ok(match objects::intact(&path, &object.hash, object.kind)? {
            Some(true) => Ok(()),
            None => Err(ObjectProblem::Missing { short }),
            Some(false) => {
                let moved_to = if self.read_only { None } else { objects::move_aside(&path, &self.damaged_dir())? };
                Err(ObjectProblem::Damaged { short, moved_to })
            }
        })
    }

    /// The folder of node `key`'s update WAL (a GRPO node's committed
    /// checkpoints and the rollouts they cover, while it runs): the one place
    /// outside its staging folder a worker writes, named by the executor.
    pub fn checkpoint_dir(root: &Path, key: &str) -> PathBuf {
        root.join("checkpoints").join(key)
    }

    pub fn log_path(&self, key: &str) -> PathBuf {
        self.root.join("logs").join(format!("{key}.log"))
    }

    /// The log of the last `run --check` re-execution of a key (its run's log stays).
    pub fn check_log_path(&self, key: &str) -> PathBuf {
        self.root.join("logs").join(format!("{key}.check.log"))
    }

    /// A fresh staging folder for one node, in this process's staging root
    /// (made on first use).
    pub fn staging(&self) -> Result<Staging, StoreError> {
        let root = {
            let mut slot = self.staging_root.lock().unwrap_or_else(|p| p.into_inner());
            match slot.as_ref() {
                Some(root) => root.clone(),
                None => {
                    let root = std::sync::Arc::new(self.staging_root()?);
                    *slot = Some(root.clone());
                    root
                }
            }
        };
        // The root made at first use is still our folder: a link put in its
        // place would have the node's folder made wherever it points.
        if !fs::symlink_metadata(&root.dir).is_ok_and(|m| m.is_dir()) {
            return Err(StoreError::Invalid(format!(
                "{} is no longer a folder orchestrate made (a link or a file was put in its place); nothing was written through it",
                root.dir.display()
            )));
        }
        let reused = root.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        // A folder waiting for reuse that is no longer a real folder (a link
        // put in its place) is removed as a link and a fresh one made.
        let reused = reused.filter(|dir| {
            let real = fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
            if !real {
                let _ = objects::remove_any(dir);
            }
            real
        });
        let dir = match reused {
            Some(dir) => dir,
            None => {
                let n = root.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let dir = root.dir.join(n.to_string());
                fs::create_dir(&dir).map_err(io(format!("creating {}", dir.display())))?;
                dir
            }
        };
        Ok(Staging { dir, _root: root })
    }

    /// Makes this process's staging root. The lock comes first: a cleaner
    /// (`clear_dead_staging` in another process) removes a lone lock it can
    /// take, which it can between our creating the file and locking it. So
    /// once locked, the lock is checked to be still the file at its path, and
    /// a removed one is made afresh.
    fn staging_root(&self) -> Result<StagingRoot, StoreError> {
        use std::os::unix::fs::MetadataExt;
        for _ in 0..100 {
            let dir = self.root.join("tmp").join(objects::unique_suffix());
            let lock_path = dir.with_extension("lock");
            let lock = File::create_new(&lock_path).map_err(io(format!("creating {}", lock_path.display())))?;
            lock.lock().map_err(io(format!("locking {}", lock_path.display())))?;
            let held = lock.metadata().map_err(io(format!("reading {}", lock_path.display())))?;
            let linked = match fs::symlink_metadata(&lock_path) {
                Ok(m) => Some((m.dev(), m.ino())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(StoreError::Io { context: format!("reading {}", lock_path.display()), source: e })
                }
            };
            if linked != Some((held.dev(), held.ino())) {
                continue;
            }
            fs::create_dir(&dir).map_err(io(format!("creating {}", dir.display())))?;
            return Ok(StagingRoot { dir, _lock: lock, next: Default::default(), free: Default::default() });
        }
        Err(StoreError::Io {
            context: format!("creating staging in {}", self.root.join("tmp").display()),
            source: std::io::Error::other("its lock was removed by other processes 100 times in a row"),
        })
    }

    /// Removes staging folders whose owner is gone (its lock can be taken), and
    /// the locks of staging that no longer exists (a process killed between
    /// creating its lock and its folder, or between removing them).
    ///
    /// Only entries named as [`Workspace::staging`] names them are touched; a
    /// link among them is removed as a link (never followed). Anything else
    /// in `tmp/` is left alone ([`Workspace::foreign_staging`] lists it).
    fn clear_dead_staging(&self) -> Result<(), StoreError> {
        let tmp = self.root.join("tmp");
        let entries = fs::read_dir(&tmp).map_err(io(format!("listing {}", tmp.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
            if !fsx::is_staging_name(&name) {
                continue;
            }
            if is_link {
                // Never ours: a link cannot be a staging folder or its lock.
                let _ = fs::remove_file(&path);
                continue;
            }
            if name.ends_with(".lock") {
                // A lock alone: its owner is gone if the lock can be taken.
                // `staging` takes its lock before making its folder and checks
                // afterwards that the lock it holds is still the one linked
                // here, so removing an untaken lock never strands a live owner.
                let staged = path.with_extension("");
                if let Ok(f) = fsx::open_lock(&path) {
                    if f.try_lock().is_ok() && fs::symlink_metadata(&staged).is_err() {
                        let _ = fs::remove_file(&path);
                    }
                }
                continue;
            }
            let lock_path = path.with_extension("lock");
            let owner_alive = match fsx::open_lock(&lock_path) {
                Ok(f) => matches!(f.try_lock(), Err(TryLockError::WouldBlock)),
                Err(_) => true,
            };
            if !owner_alive {
                objects::remove_any(&path)?;
                let _ = fs::remove_file(&lock_path);
            }
        }
        Ok(())
    }

    /// Entries in `tmp/` that orchestrate did not create (left alone by every cleanup).
    pub fn foreign_staging(&self) -> Vec<PathBuf> {
        let tmp = self.root.join("tmp");
        let mut found: Vec<PathBuf> = fs::read_dir(&tmp)
            .map(|d| {
                d.flatten()
                    .filter(|e| !fsx::is_staging_name(&e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }

    /// Takes the lock of a node key. If another process holds it, `waiting` is
    /// called once (to say so) and this blocks until it is released.
    ///
    /// Every node's lock is one byte of one file, `locks/nodes.lock`, at an
    /// offset named by the key's blake3 (60 bits; two keys sharing one only
    /// wait for each other). The byte is held with an open-file-description
    /// lock (`F_OFD_SETLK`): like `flock`, it belongs to this open of the
    /// file, so two threads of one process exclude each other as two
    /// processes do, and the kernel releases it when the file is closed or
    /// the process dies. Before, each key had a lock file of its own: a file
    /// made per node (creating an inode was a sixth of a small node's own
    /// time on ext4) and never removed.
    pub fn lock_node(&self, key: &str, waiting: impl FnOnce()) -> Result<NodeLock, StoreError> {
        self.lock_node_with(key, waiting, None)
    }

    /// [`Workspace::lock_node`], whose wait `stop` can end (a run's Ctrl-C):
    /// then [`StoreError::Interrupted`].
    pub fn lock_node_until(
        &self,
        key: &str,
        waiting: impl FnOnce(),
        stop: &dyn Fn() -> bool,
    ) -> Result<NodeLock, StoreError> {
        self.lock_node_with(key, waiting, Some(stop))
    }

    fn lock_node_with(
        &self,
        key: &str,
        waiting: impl FnOnce(),
        stop: Option<&dyn Fn() -> bool>,
    ) -> Result<NodeLock, StoreError> {
        let path = self.root.join("locks").join(NODE_LOCKS);
        let file = fsx::open_lock(&path).map_err(io(format!("opening {}", path.display())))?;
        let taken = take_lock_byte(&file, node_lock_offset(key), waiting, stop)
            .map_err(|e| StoreError::Io { context: format!("locking {} (node {key})", path.display()), source: e })?;
        if !taken {
            return Err(StoreError::Interrupted { waiting: format!("node key {}", &key[..key.len().min(12)]) });
        }
        Ok(NodeLock { _files: vec![file] })
    }

    /// Holds the outs `outs` of the spec in `spec_dir` in the user's tree
    /// for as long as the returned lock lives: while a node removes, writes
    /// and stores them, or a checkout replaces them. Two runs of one spec
    /// with other params (other keys, so no node lock between them) write
    /// the same outs; without this the second removed and rewrote an out
    /// while the first was still writing it, and the first stored the mix
    /// under its own key. One byte of `locks/outs.lock` per out's real path
    /// (as [`Workspace::lock_node`]), and the same byte of `outs.lock` in the
    /// machine's folder ([`fsx::machine_dir`]): the first holds the out across
    /// the machines that share this workspace (Slurm jobs), the second across
    /// the workspaces of this machine (`--workspace a` and `--workspace b`
    /// over one spec wrote the same out side by side before). Taken in order,
    /// so two holders never wait on each other; `waiting(out)` is called once
    /// before waiting for an out.
    /// `stop` can end a wait (a run's Ctrl-C): then [`StoreError::Interrupted`].
    pub fn lock_outs<'a>(
        &self,
        spec_dir: &Path,
        outs: impl IntoIterator<Item = &'a String>,
        mut waiting: impl FnMut(&str),
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<NodeLock>, StoreError> {
        let outs: Vec<&String> = outs.into_iter().collect();
        if outs.is_empty() {
            return Ok(None);
        }
        let dir = spec_dir.canonicalize().map_err(io(format!("resolving {}", spec_dir.display())))?;
        let mut at: Vec<(i64, &String)> =
            outs.into_iter().map(|o| (node_lock_offset(&dir.join(o).to_string_lossy()), o)).collect();
        at.sort();
        at.dedup_by_key(|(offset, _)| *offset);
        let mut files = Vec::with_capacity(2);
        for path in [Some(self.root.join("locks").join(OUT_LOCKS)), fsx::machine_dir().map(|d| d.join(OUT_LOCKS))]
            .into_iter()
            .flatten()
        {
            let file = fsx::open_lock(&path).map_err(io(format!("opening {}", path.display())))?;
            files.push((path, file));
        }
        for (offset, out) in at {
            // This workspace's byte, then the machine's: in one order for every holder.
            let mut said = false;
            for (path, file) in &files {
                let say = || {
                    if !std::mem::replace(&mut said, true) {
                        waiting(out)
                    }
                };
                let taken = take_lock_byte(file, offset, say, Some(stop)).map_err(|e| StoreError::Io {
                    context: format!("locking {} (out '{out}')", path.display()),
                    source: e,
                })?;
                if !taken {
                    return Err(StoreError::Interrupted { waiting: format!("the out '{out}'") });
                }
            }
        }
        Ok(Some(NodeLock { _files: files.into_iter().map(|(_, f)| f).collect() }))
    }

    /// Publishes a file or a folder from the user's tree (copied; it stays
    /// where it is). A link, or one inside the folder, is refused.
    pub fn publish_copy(&self, src: &Path, staging: &Staging) -> Result<ObjectInfo, StoreError> {
        let meta = fs::symlink_metadata(src).map_err(io(format!("reading {}", src.display())))?;
        if meta.file_type().is_symlink() {
            return Err(StoreError::Invalid(format!(
                "{} is a symbolic link; outs are stored from real files and folders only",
                src.display()
            )));
        }
        if meta.is_dir() {
            objects::publish_copy_dir(&self.objects_dir(), staging.path(), src)
        } else {
            objects::publish_copy(&self.objects_dir(), staging.path(), src)
        }
    }

    /// Whether every object of a cached node is in the store, so its outputs
    /// in the user's tree can be checked out instead of the node running.
    pub fn objects_present(&self, node: &CachedNode) -> bool {
        node.outputs.iter().filter(|o| o.stored()).all(|o| self.has_object(&o.object))
    }

    /// Whether the out `rel`, which differs from its object, holds bytes the
    /// store lacks: `Some(how it differs)` for an edit only the tree has.
    fn unstored_edit(&self, index: &Index, rel: &str, spec_dir: &Path, problem: &OutputProblem) -> Option<String> {
        let what = match problem {
            OutputProblem::Modified { what, .. } => what.clone(),
            OutputProblem::Unreadable { error, .. } => return Some(format!("it cannot be read: {error}")),
            // Nothing there, no object to restore, or an edit already moved aside.
            OutputProblem::Missing { .. } | OutputProblem::NotInStore { .. } | OutputProblem::ObjectEdited { .. } => {
                return None
            }
        };
        (!self.holds_bytes_of(index, &spec_dir.join(rel))).then_some(what)
    }

    /// Whether the store holds the bytes of the file or folder at `path`
    /// (hashed through the stat cache); not for anything else, or unreadable.
    fn holds_bytes_of(&self, index: &Index, path: &Path) -> bool {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => self.hash_user_tree(index, path).is_ok_and(|t| self.object_path(&t.hash).is_dir()),
            Ok(m) if m.is_file() => self.hash_user_file(index, path).is_ok_and(|h| self.object_path(&h).is_file()),
            _ => false,
        }
    }

    /// Before an out is removed for its node to run: if what stands at
    /// `spec_dir/rel` holds bytes the store lacks (a folder of the user's
    /// own, a hand edit, a file added to a folder out), it is moved into
    /// the workspace's trash instead, and where is returned. `last` is the
    /// node's latest record of that out: an out still as it recorded is the
    /// store's, found by stat alone (before anything else walks or hashes
    /// it). What is not [`Workspace::movable`] is left where it is.
    pub fn set_aside_unstored(
        &self,
        index: &Index,
        spec_dir: &Path,
        rel: &str,
        last: Option<&OutputRecord>,
    ) -> Result<Option<MovedOut>, StoreError> {
        if !Self::stands(spec_dir, rel) {
            return Ok(None);
        }
        if let Some(out) = last.filter(|o| o.workspace_path.as_deref() == Some(rel)) {
            if matches!(self.check_output(index, &mut out.clone(), spec_dir)?, Checked::Same) {
                return Ok(None);
            }
        }
        if !Self::movable(spec_dir, rel)? || self.holds_bytes_of(index, &spec_dir.join(rel)) {
            return Ok(None);
        }
        self.move_to_trash(spec_dir, rel).map(Some)
    }

    /// Moves the out `spec_dir/rel` into the workspace's trash whatever it
    /// holds (complete outputs a node may not store, kept for the user);
    /// `None` where it is not [`Workspace::movable`].
    pub fn move_out_to_trash(&self, spec_dir: &Path, rel: &str) -> Result<Option<MovedOut>, StoreError> {
        if !Self::movable(spec_dir, rel)? {
            return Ok(None);
        }
        self.move_to_trash(spec_dir, rel).map(Some)
    }

    /// Whether an out in the tree is one to move into the trash: a file or a
    /// folder is there, no link on its way, and (a folder) it holds nothing
    /// no out may hold ([`fsx::kept_within`]). Those are left to
    /// [`fsx::remove_out`], which removes a link as a link and refuses the rest.
    fn movable(spec_dir: &Path, rel: &str) -> Result<bool, StoreError> {
        if !Self::stands(spec_dir, rel) {
            return Ok(false);
        }
        let path = spec_dir.join(rel);
        let folder = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        Ok(!(folder && fsx::kept_within(&path).map_err(io(format!("reading {}", path.display())))?.is_some()))
    }

    /// Whether a file or a folder stands at `spec_dir/rel`, with no link on
    /// its way: the cheap half of [`Workspace::movable`], without a walk.
    fn stands(spec_dir: &Path, rel: &str) -> bool {
        let meta = fs::symlink_metadata(spec_dir.join(rel));
        meta.is_ok_and(|m| m.is_dir() || m.is_file()) && fsx::link_on_path(spec_dir, rel).is_none()
    }

    /// Moves `spec_dir/rel` to `trash/<time>-<pid>-<n>/rel` in the workspace:
    /// a rename, or, with the workspace on another filesystem, a copy (links
    /// and special files refused, the copy removed) and then the removal, as
    /// `mv` does.
    fn move_to_trash(&self, spec_dir: &Path, rel: &str) -> Result<MovedOut, StoreError> {
        static MOVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let stamp = now_rfc3339().replace(['-', ':'], "").trim_end_matches('Z').replace('.', "");
        let n = MOVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let set = self.trash_dir().join(format!("{stamp}-{}-{n}", std::process::id()));
        let to = set.join(rel);
        let parent = to.parent().expect("a path in the trash has a parent");
        fsx::own_dir(&self.trash_dir())?;
        fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        let from = spec_dir.join(rel);
        let refused = |e: &dyn std::fmt::Display| {
            StoreError::Invalid(format!(
                "out '{rel}' holds bytes the store lacks, which are never removed, and they could not be moved \
                 into {} ({e}). Move them away yourself and run again",
                self.trash_dir().display()
            ))
        };
        match fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                let kind = if fs::symlink_metadata(&from).is_ok_and(|m| m.is_dir()) {
                    OutputKind::Dir
                } else {
                    OutputKind::File
                };
                if let Err(e) = objects::copy_out(&from, &to, kind, &[objects::CacheType::Copy]) {
                    let _ = objects::remove_any(&set);
                    return Err(refused(&e));
                }
                objects::remove_any(&from)?;
            }
            Err(e) => {
                let _ = objects::remove_any(&set);
                return Err(refused(&e));
            }
        }
        Ok(MovedOut { path: rel.to_string(), to })
    }

    /// The cached node's outs whose bytes in the tree the store does not
    /// hold (a hand edit, a file added to a folder out): what replacing the
    /// outs would lose, as a checkout without `--force` keeps them.
    pub fn unstored_edits(
        &self,
        index: &Index,
        node: &CachedNode,
        spec_dir: &Path,
    ) -> Result<Vec<KeptOut>, StoreError> {
        let mut kept = Vec::new();
        for o in &node.outputs {
            let Some(rel) = &o.workspace_path else { continue };
            if let Checked::Differs(problem) = self.check_output(index, &mut o.clone(), spec_dir)? {
                if let Some(changes) = self.unstored_edit(index, rel, spec_dir, &problem) {
                    kept.push(KeptOut { path: rel.clone(), changes });
                }
            }
        }
        Ok(kept)
    }

    /// Checks a cached node's outputs out of the store into the user's tree
    /// where they are missing or differ (as `dvc checkout`): each is copied to
    /// a temporary name beside it, then the old out is removed whole and the
    /// copy renamed into place, so a crash leaves the old out or the new one.
    /// Nothing is written through a link. Returns the outputs as now recorded,
    /// and how many files and bytes were restored.
    ///
    /// `replace` says which outs: every one that differs (`run`), only those
    /// missing (`pull`), or also those whose bytes in the tree the store
    /// holds, keeping edits it does not hold (`checkout`, as `dvc checkout`
    /// keeps them without `--force`).
    pub fn restore_outputs(
        &self,
        index: &Index,
        node: &CachedNode,
        spec_dir: &Path,
        replace: Replace,
    ) -> Result<Restored, StoreError> {
        let types = objects::CacheType::from_env().map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut outputs = node.outputs.clone();
        let (mut files, mut bytes, mut kept, mut moved) = (0u64, 0u64, Vec::new(), Vec::new());
        // The real folders the outs are checked against, resolved once, for
        // the first out that is replaced.
        let mut beside: Option<fsx::OutsBeside> = None;
        for o in &mut outputs {
            let Some(rel) = o.workspace_path.clone() else { continue };
            if replace == Replace::Missing && fs::symlink_metadata(spec_dir.join(&rel)).is_ok() {
                continue;
            }
            let Checked::Differs(problem) = self.check_output(index, o, spec_dir)? else { continue };
            let unstored = self.unstored_edit(index, &rel, spec_dir, &problem);
            if replace == Replace::Stored {
                if let Some(changes) = unstored {
                    kept.push(KeptOut { path: rel, changes });
                    continue;
                }
            }
            let refuse = |e| StoreError::Invalid(format!("node '{}': {e}", node.node_id));
            if beside.is_none() {
                beside = Some(fsx::OutsBeside::new(spec_dir, &self.root).map_err(refuse)?);
            }
            beside.as_ref().expect("resolved above").check([&rel]).map_err(refuse)?;
            let dest = spec_dir.join(&rel);
            if let Some(link) = fsx::link_on_path(spec_dir, &rel).filter(|l| *l != dest) {
                return Err(StoreError::Invalid(format!(
                    "{} is a symbolic link; the output '{rel}' is not written through it",
                    link.display()
                )));
            }
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
            }
            // Copies a killed checkout left (every caller holds the out's lock).
            fsx::remove_checkout_leftovers(&dest).map_err(io(format!("clearing old copies of {}", dest.display())))?;
            let tmp = fsx::checkout_temp(&dest, &objects::unique_suffix());
            let copied = objects::copy_out(&self.object_path(&o.object.hash), &tmp, o.object.kind, &types);
            if let Err(e) = copied {
                let _ = objects::remove_any(&tmp);
                return Err(e);
            }
            // What is placed is the object's bytes: one damaged after it was
            // stored is moved aside (so the store never serves it) and never
            // placed; the node's out is left as it was.
            match objects::intact(&tmp, &o.object.hash, o.object.kind) {
                Ok(Some(true)) => {}
                checked => {
                    let _ = objects::remove_any(&tmp);
                    checked?;
                    let problem = match self.check_object(&o.object)? {
                        Err(problem) => problem,
                        // Sound now (replaced meanwhile): said as the copy found it.
                        Ok(()) => ObjectProblem::Damaged { short: o.object.hash[..12].to_string(), moved_to: None },
                    };
                    return Err(StoreError::DamagedObject { node: node.node_id.clone(), out: rel, problem });
                }
            }
            // Bytes only the tree has are moved into the trash, never removed.
            let aside = match unstored {
                Some(_) => self.move_out_to_trash(spec_dir, &rel),
                None => Ok(None),
            };
            match aside {
                Ok(Some(m)) => moved.push(m),
                Ok(None) => {}
                Err(e) => {
                    let _ = objects::remove_any(&tmp);
                    return Err(e);
                }
            }
            if let Err(e) = fsx::remove_out(spec_dir, &rel) {
                let _ = objects::remove_any(&tmp);
                return Err(io(format!("removing {}", dest.display()))(e));
            }
            fs::rename(&tmp, &dest).map_err(io(format!("renaming {} to {}", tmp.display(), dest.display())))?;
            o.stat = FileStat::of(&dest).ok();
            files += o.object.files;
            bytes += o.object.size;
        }
        if !self.read_only {
            index.update_outputs(&node.key, &outputs)?;
        }
        Ok(Restored { outputs, files, bytes, kept, moved })
    }

    /// How a folder in the user's tree differs from a stored folder object:
    /// `val.jsonl changed, checkpoint-last.json added` (the first ten).
    fn tree_changes(&self, index: &Index, stored: &Path, dir: &Path) -> String {
        let list = |root: &Path| -> BTreeMap<String, PathBuf> {
            objects::list_files(root)
                .unwrap_or_default()
                .into_iter()
                .map(|rel| (rel.to_string_lossy().into_owned(), root.join(rel)))
                .collect()
        };
        let (old, new) = (list(stored), list(dir));
        let mut changes = Vec::new();
        for (rel, path) in &new {
            match old.get(rel) {
                None => changes.push(format!("{rel} added")),
                Some(was) => {
                    let same = self.hash_user_file(index, was).ok() == self.hash_user_file(index, path).ok();
                    if !same {
                        changes.push(format!("{rel} changed"));
                    }
                }
            }
        }
        changes.extend(old.keys().filter(|r| !new.contains_key(*r)).map(|r| format!("{r} removed")));
        let more = changes.len().saturating_sub(10);
        changes.truncate(10);
        let mut text = changes.join(", ");
        if more > 0 {
            text.push_str(&format!(" and {more} more"));
        }
        text
    }

    /// A folder in the user's tree as the store would hash it, each file
    /// re-hashed only when its stat changed.
    pub fn hash_user_tree(&self, index: &Index, dir: &Path) -> Result<ObjectInfo, StoreError> {
        objects::tree_hash_with(dir, |file| self.hash_user_file_sized(index, file))
    }

    /// Publishes a staged output (moved into the store).
    pub fn publish_move(&self, staged: &Path, kind: OutputKind) -> Result<ObjectInfo, StoreError> {
        objects::publish_move(&self.objects_dir(), staged, kind)
    }

    /// The blake3 of a file in the user's tree, re-hashed only when its stat changed.
    pub fn hash_user_file(&self, index: &Index, path: &Path) -> Result<String, StoreError> {
        self.hash_user_file_sized(index, path).map(|(h, _)| h)
    }

    /// [`Workspace::hash_user_file`], with the size its stat gave.
    fn hash_user_file_sized(&self, index: &Index, path: &Path) -> Result<(String, u64), StoreError> {
        let stat = FileStat::of(path).map_err(io(format!("reading {}", path.display())))?;
        let abs = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let key = abs.to_string_lossy();
        if let Some(h) = index.file_hash(&key, &stat)? {
            return Ok((h, stat.size));
        }
        let (h, _) = hash_file(path)?;
        if !self.read_only {
            index.put_file_hash(&key, &stat, &h)?;
        }
        Ok((h, stat.size))
    }

    /// Whether the store holds this object: a file of its size, or a folder
    /// (the cheap check; `check_object` re-hashes).
    pub fn has_object(&self, object: &ObjectInfo) -> bool {
        let path = self.object_path(&object.hash);
        match object.kind {
            OutputKind::File => fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == object.size),
            OutputKind::Dir => path.is_dir(),
        }
    }

    /// A cached node's outputs as they stand now (`Ok`), or why they can no
    /// longer be trusted (`Err`). Outputs in the user's tree are re-hashed
    /// only when their stat changed; a stat-only change (touch) that leaves
    /// the bytes equal is refreshed in the returned records and in the
    /// index row, not a miss.
    pub fn check_outputs(
        &self,
        index: &Index,
        key: &str,
        mut refreshed: Vec<OutputRecord>,
        spec_dir: &Path,
    ) -> Result<Result<Vec<OutputRecord>, OutputProblem>, StoreError> {
        let mut changed = false;
        for out in refreshed.iter_mut() {
            match self.check_output(index, out, spec_dir)? {
                Checked::Same => {}
                Checked::Refreshed => changed = true,
                Checked::Differs(why) => return Ok(Err(why)),
            }
        }
        if changed && !self.read_only {
            index.update_outputs(key, &refreshed)?;
        }
        Ok(Ok(refreshed))
    }

    /// One output against its object: in the store, and (for one in the
    /// user's tree) the same bytes there; a stat-only change refreshes `out.stat`.
    fn check_output(&self, index: &Index, out: &mut OutputRecord, spec_dir: &Path) -> Result<Checked, StoreError> {
        let checked = self.compare_output(index, out, spec_dir)?;
        if let Checked::Differs(problem) = &checked {
            // An out checked out as a hard link is the object itself: an edit
            // made to it anyway (after a chmod) edited the object. Such an
            // object is moved aside here, so the store never serves it.
            if out.workspace_path.is_some() && self.has_object(&out.object) && self.shares_inodes(out, spec_dir) {
                if let Err(damage) = self.check_object(&out.object)? {
                    let problem = Box::new(problem.clone());
                    return Ok(Checked::Differs(OutputProblem::ObjectEdited { problem, damage }));
                }
            }
        }
        Ok(checked)
    }

    /// Whether an out in the tree shares an inode with its object (a hard
    /// link, or a folder holding one).
    fn shares_inodes(&self, out: &OutputRecord, spec_dir: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(rel) = &out.workspace_path else { return false };
        let (object, tree) = (self.object_path(&out.object.hash), spec_dir.join(rel));
        let same = |a: &Path, b: &Path| match (fs::symlink_metadata(a), fs::symlink_metadata(b)) {
            (Ok(x), Ok(y)) => x.is_file() && x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        };
        match out.object.kind {
            OutputKind::File => same(&object, &tree),
            OutputKind::Dir => objects::list_files(&object)
                .map(|files| files.iter().any(|f| same(&object.join(f), &tree.join(f))))
                .unwrap_or(false),
        }
    }

    /// [`Workspace::check_output`] before the hard-link check.
    fn compare_output(&self, index: &Index, out: &mut OutputRecord, spec_dir: &Path) -> Result<Checked, StoreError> {
        if !out.stored() {
            // Dropped by gc on purpose (a store-only training state): the node
            // stands by its hash; a run that needs the bytes runs it again.
            return Ok(Checked::Same);
        }
        if !self.has_object(&out.object) {
            return Ok(Checked::Differs(OutputProblem::NotInStore { name: out.name.clone() }));
        }
        let Some(rel) = &out.workspace_path else {
            return Ok(Checked::Same);
        };
        let path = spec_dir.join(rel);
        if out.object.kind == OutputKind::Dir {
            // A folder out: every file's stat (hashed again only if it changed), and no file more or less.
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Ok(Checked::Differs(OutputProblem::Missing { path: rel.clone() }));
            }
            return Ok(match self.hash_user_tree(index, &path) {
                Ok(now) if now.hash == out.object.hash => Checked::Same,
                Ok(_) => {
                    let what = self.tree_changes(index, &self.object_path(&out.object.hash), &path);
                    Checked::Differs(OutputProblem::Modified { path: rel.clone(), what })
                }
                Err(e) => Checked::Differs(OutputProblem::Unreadable { path: rel.clone(), error: e.to_string() }),
            });
        }
        let Ok(stat) = FileStat::of(&path) else {
            return Ok(Checked::Differs(OutputProblem::Missing { path: rel.clone() }));
        };
        if Some(stat) == out.stat {
            return Ok(Checked::Same);
        }
        if stat.size != out.object.size {
            let what = format!("size {} → {}", out.object.size, stat.size);
            return Ok(Checked::Differs(OutputProblem::Modified { path: rel.clone(), what }));
        }
        // Through the stat cache: whether the store holds these bytes (a
        // restore's or a run's next question, `holds_bytes_of`) is then a lookup.
        let h = self.hash_user_file(index, &path)?;
        if h != out.object.hash {
            let what = "content changed".to_string();
            return Ok(Checked::Differs(OutputProblem::Modified { path: rel.clone(), what }));
        }
        out.stat = Some(stat);
        Ok(Checked::Refreshed)
    }
}

#[cfg(test)]
mod node_lock_tests {
    use super::Workspace;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A key's lock excludes every other holder of that key (another thread
    /// here, another process in `crash_and_concurrency`), which is told to
    /// wait and goes on when it is released; other keys are free meanwhile;
    /// and however many keys are locked, `locks/` holds one file.
    #[test]
    fn a_node_lock_excludes_its_key_alone_and_all_keys_share_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let key = |i: u32| blake3::hash(&i.to_le_bytes()).to_hex().to_string();
        let held = ws.lock_node(&key(0), || panic!("nobody holds it")).unwrap();
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let told = AtomicBool::new(false);
                let _second = ws.lock_node(&key(0), || told.store(true, Ordering::SeqCst)).unwrap();
                assert!(released.load(Ordering::SeqCst), "taken while the first holder still held it");
                told.load(Ordering::SeqCst)
            });
            std::thread::sleep(Duration::from_millis(200));
            // Meanwhile every other key is free.
            let others: Vec<_> =
                (1..100).map(|i| ws.lock_node(&key(i), || panic!("key {i} waited")).unwrap()).collect();
            assert!(!waiter.is_finished(), "the second holder did not wait");
            drop(others);
            released.store(true, Ordering::SeqCst);
            drop(held);
            assert!(waiter.join().unwrap(), "the waiter was not told it waits");
        });
        let files: Vec<_> =
            std::fs::read_dir(dir.path().join("locks")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(files, ["nodes.lock"]);
    }
}

#[cfg(test)]
mod staging_tests {
    use super::Workspace;

    #[test]
    fn an_orphan_staging_lock_is_removed_and_a_live_ones_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let tmp = dir.path().join("tmp");
        // Left by a process killed between creating its lock and its folder.
        let orphan = tmp.join("4242-1700000000000000000-7.lock");
        let file = std::fs::File::create(&orphan).unwrap();
        file.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600)).unwrap();
        drop(file);
        // A live process's staging, with its lock held.
        let live = ws.staging().unwrap();
        Workspace::open(dir.path()).unwrap();
        assert!(!orphan.exists(), "the orphan lock is removed");
        let root = live.path().parent().unwrap();
        assert!(live.path().exists() && root.with_extension("lock").exists(), "live staging is kept");
    }

    /// A workspace, and beside it a folder of the user's holding `notes.txt`
    /// ("keep"), which a link planted in the workspace may point to.
    fn beside_a_users_folder() -> (tempfile::TempDir, Workspace, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(&dir.path().join("ws")).unwrap();
        let outside = dir.path().join("users");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("notes.txt"), "keep").unwrap();
        (dir, ws, outside)
    }

    /// A node's staging folder replaced by a link to the user's folder:
    /// dropping it removes the link, never what the link points to.
    #[test]
    fn a_link_planted_at_a_staging_folder_is_removed_not_followed() {
        let (_dir, ws, outside) = beside_a_users_folder();
        let staging = ws.staging().unwrap();
        let at = staging.path().to_path_buf();
        std::fs::remove_dir(&at).unwrap();
        std::os::unix::fs::symlink(&outside, &at).unwrap();
        drop(staging);
        assert_eq!(std::fs::read_to_string(outside.join("notes.txt")).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&at).is_err(), "the link was left in staging");
        // The next node gets a real folder, not the link's place.
        let next = ws.staging().unwrap();
        assert!(std::fs::symlink_metadata(next.path()).unwrap().is_dir());
        // A finished node's folder waiting for reuse, replaced by a link:
        // not handed out, and what it points to is untouched.
        let reused = next.path().to_path_buf();
        drop(next);
        std::fs::remove_dir(&reused).unwrap();
        std::os::unix::fs::symlink(&outside, &reused).unwrap();
        let again = ws.staging().unwrap();
        assert!(std::fs::symlink_metadata(again.path()).unwrap().is_dir(), "a link was handed out as staging");
        drop(again);
        assert_eq!(std::fs::read_to_string(outside.join("notes.txt")).unwrap(), "keep");
    }

    /// The staging root replaced by a link while the process runs: the next
    /// node's staging is refused, nothing is made where the link points, and
    /// the link alone is removed with the workspace.
    #[test]
    fn a_link_planted_at_the_staging_root_is_refused_and_never_written_through() {
        let (_dir, ws, outside) = beside_a_users_folder();
        let root = ws.staging().unwrap().path().parent().unwrap().to_path_buf();
        super::objects::remove_any(&root).unwrap();
        std::os::unix::fs::symlink(&outside, &root).unwrap();
        let err = ws.staging().err().expect("staging through a link").to_string();
        assert!(err.contains("no longer a folder"), "{err}");
        drop(ws);
        let listed: Vec<_> = std::fs::read_dir(&outside).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(listed, vec![std::ffi::OsString::from("notes.txt")]);
        assert_eq!(std::fs::read_to_string(outside.join("notes.txt")).unwrap(), "keep");
    }

    /// A process's nodes stage in one root (one folder and one lock made per
    /// process, not per node); a node's folder is emptied when it is dropped
    /// and reused; the root and its lock go with the last handle on the
    /// workspace.
    #[test]
    fn a_processs_stagings_share_one_root_removed_with_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let clone = ws.clone();
        let (a, b) = (ws.staging().unwrap(), clone.staging().unwrap());
        assert_ne!(a.path(), b.path());
        let root = a.path().parent().unwrap().to_path_buf();
        assert_eq!(b.path().parent().unwrap(), root, "each node made a staging root of its own");
        let a_dir = a.path().to_path_buf();
        std::fs::write(a_dir.join("partial"), "x").unwrap();
        drop(a);
        // Emptied, a's folder is the next node's.
        assert!(a_dir.is_dir() && !a_dir.join("partial").exists() && root.with_extension("lock").is_file());
        let c = ws.staging().unwrap();
        assert_eq!(c.path(), a_dir, "a finished node's folder was not reused");
        drop((b, c, ws, clone));
        let left: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().map(|e| e.unwrap().path()).collect();
        assert!(left.is_empty(), "left in tmp: {left:?}");
    }

    /// The repro of issue #30: `tmp` a link to the user's folder. Before,
    /// the staging cleanup emptied the folder the link points to.
    #[test]
    fn a_linked_internal_folder_is_refused_and_what_it_points_to_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let keep = dir.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("notes.txt"), "x").unwrap();
        for sub in ["tmp", "objects", "locks", "logs"] {
            let ws = dir.path().join(format!("ws-{sub}"));
            Workspace::open(&ws).unwrap();
            std::fs::remove_dir(ws.join(sub)).unwrap();
            std::os::unix::fs::symlink(&keep, ws.join(sub)).unwrap();
            let err = Workspace::open(&ws).unwrap_err().to_string();
            assert!(err.contains("symbolic link") && err.contains(sub), "{sub}: {err}");
            assert!(keep.join("notes.txt").is_file(), "{sub}: the linked folder was emptied");
        }
    }

    /// `--workspace ~` must never clean `~/tmp`.
    #[test]
    fn a_folder_that_is_not_a_workspace_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join("tmp")).unwrap();
        std::fs::write(home.join("tmp/draft.txt"), "mine").unwrap();
        std::fs::write(home.join(".bashrc"), "mine").unwrap();
        let err = Workspace::open(&home).unwrap_err().to_string();
        assert!(err.contains("not an orchestrate workspace"), "{err}");
        assert!(Workspace::open_read_only(&home).is_err(), "a read-only open refuses it too");
        let left: Vec<_> = std::fs::read_dir(&home).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "nothing was added: {left:?}");
        assert_eq!(std::fs::read_to_string(home.join("tmp/draft.txt")).unwrap(), "mine");
        // A new or empty folder becomes a workspace, marked; an old unmarked one is adopted.
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        Workspace::open(&empty).unwrap();
        Workspace::open(&dir.path().join("new/deeper")).unwrap();
        assert!(empty.join(super::MARKER).is_file() && dir.path().join("new/deeper").join(super::MARKER).is_file());
        let old = dir.path().join("old");
        Workspace::open(&old).unwrap();
        std::fs::remove_file(old.join(super::MARKER)).unwrap();
        Workspace::open(&old).unwrap();
        assert!(old.join(super::MARKER).is_file(), "a workspace from before the marker is marked");
        // A folder holding only its config file (the remote, trusted keys,
        // written before the first run, as docs/remote.md says) becomes one.
        let configured = dir.path().join("configured");
        std::fs::create_dir(&configured).unwrap();
        std::fs::write(configured.join("config.yaml"), "trusted_keys: []\n").unwrap();
        Workspace::open(&configured).unwrap();
        assert_eq!(std::fs::read_to_string(configured.join("config.yaml")).unwrap(), "trusted_keys: []\n");
        // ...but not one whose config.yaml is a link, nor one with anything beside it.
        for (name, extra) in [("linked", true), ("more", false)] {
            let f = dir.path().join(name);
            std::fs::create_dir(&f).unwrap();
            if extra {
                std::os::unix::fs::symlink(home.join(".bashrc"), f.join("config.yaml")).unwrap();
            } else {
                std::fs::write(f.join("config.yaml"), "").unwrap();
                std::fs::write(f.join("notes.txt"), "mine").unwrap();
            }
            assert!(Workspace::open(&f).unwrap_err().to_string().contains("not an orchestrate workspace"), "{name}");
        }
    }

    /// Processes opening one new workspace at the same moment all get it
    /// (CI caught one refusing the folder the other was marking).
    #[test]
    fn concurrent_first_opens_of_a_new_workspace_all_succeed() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join(format!("ws-{round}"));
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..4).map(|_| s.spawn(|| Workspace::open(&root).map(drop))).collect();
                for h in handles {
                    h.join().unwrap().unwrap();
                }
            });
            let names: Vec<String> = std::fs::read_dir(&root)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(!names.iter().any(|n| super::is_marker_tmp(n)), "a temporary marker was left: {names:?}");
        }
    }

    /// Cleanups remove only what has the form of our own staging.
    #[test]
    fn staging_cleanup_leaves_what_it_did_not_create() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::write(tmp.join("notes.txt"), "x").unwrap();
        std::fs::create_dir(tmp.join("someones-folder")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f"), "x").unwrap();
        // A link with a staging name: removed as a link, its target untouched.
        std::os::unix::fs::symlink(&outside, tmp.join("4242-1-0")).unwrap();
        Workspace::open(dir.path()).unwrap();
        assert!(tmp.join("notes.txt").is_file() && tmp.join("someones-folder").is_dir());
        assert!(outside.join("f").is_file());
        assert!(std::fs::symlink_metadata(tmp.join("4242-1-0")).is_err());
        assert_eq!(ws.foreign_staging(), vec![tmp.join("notes.txt"), tmp.join("someones-folder")]);
    }

    /// A process SIGKILLed between creating its lock and its folder (or between
    /// removing them) leaves a lone lock; the next run removes it whatever its age.
    #[test]
    fn a_fresh_orphan_lock_is_removed_by_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        Workspace::open(dir.path()).unwrap();
        let orphan = dir.path().join("tmp").join("4242-1-0.lock");
        std::fs::File::create(&orphan).unwrap();
        Workspace::open(dir.path()).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().map(|e| e.unwrap().path()).collect();
        assert!(left.is_empty(), "left in tmp: {left:?}");
    }

    /// Cleaners racing a process that is creating its staging never take it
    /// away: each staging handed out keeps its folder and its own lock.
    #[test]
    fn staging_survives_cleaners_running_beside_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        Workspace::open(dir.path()).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        // Stops the cleaners however the loop below ends, a failed assert included.
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        Workspace::open(dir.path()).unwrap();
                    }
                });
            }
            let _stop = StopOnDrop(&stop);
            for _ in 0..2000 {
                // A workspace opened afresh makes a staging root of its own.
                let ws = Workspace::open(dir.path()).unwrap();
                let staging = ws.staging().unwrap();
                let lock = staging.path().parent().unwrap().with_extension("lock");
                assert!(staging.path().is_dir(), "{} was removed under its owner", staging.path().display());
                let linked = std::fs::metadata(&lock).map(|m| m.ino()).ok();
                assert_eq!(
                    linked,
                    Some(staging._root._lock.metadata().unwrap().ino()),
                    "{} is not the lock held",
                    lock.display()
                );
            }
        });
    }
}

#[cfg(test)]
mod key_tests {
    use super::Key;

    #[test]
    fn a_key_is_64_lowercase_hex_digits_and_nothing_else() {
        let good = "0123456789abcdef".repeat(4);
        assert_eq!(Key::parse(&good).unwrap().as_str(), good);
        for bad in ["", "abc", "../../etc/passwd", &"A".repeat(64), &format!("{good}0"), &"g".repeat(64)] {
            assert!(Key::parse(bad).is_err(), "{bad:?}");
        }
        // Read from JSON (a ticket, a manifest) with the same check.
        assert!(serde_json::from_str::<Key>(&format!("\"{good}\"")).is_ok());
        assert!(serde_json::from_str::<Key>("\"../x\"").is_err());
        assert_eq!(Key::from_digest(blake3::hash(b"x")).len(), 64);
    }
}
