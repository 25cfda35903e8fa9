//! Content-addressed, write-once objects with atomic publish.
//!
//! An object is a file or a folder stored at `objects/<h[..2]>/<h>`, where `h` is
//! the blake3 of a file's bytes, or of a folder's sorted listing
//! (`relative path \0 file hash \0 size \n` per file). Publishing writes to a
//! temporary name on the same file system, fsyncs, then renames, so a reader
//! sees a complete object or none. Objects are made read-only.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StoreError;

/// Whether an output is one file or a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    File,
    Dir,
}

/// What publishing an output recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    pub hash: String,
    pub kind: OutputKind,
    /// Bytes of the file, or of all files of a folder.
    pub size: u64,
    /// Number of files (1 for a file).
    pub files: u64,
}

pub(crate) fn object_rel(hash: &str) -> PathBuf {
    PathBuf::from(&hash[..2]).join(hash)
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

/// Hashes a regular file's bytes with blake3 (a FIFO or a device there is
/// an error, never waited on).
pub fn hash_file(path: &Path) -> Result<(String, u64), StoreError> {
    let mut f = crate::fsread::open_regular(path, 0).map_err(io(format!("opening {}", path.display())))?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((hasher.finalize().to_hex().to_string(), size))
}

/// Files under a folder, relative, sorted; symlinks are refused (they would
/// make the object depend on something outside it).
pub(crate) fn list_files(root: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for entry in fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))? {
            let entry = entry.map_err(io(format!("listing {}", dir.display())))?;
            let ty = entry.file_type().map_err(io(format!("reading {}", entry.path().display())))?;
            let child = rel.join(entry.file_name());
            if ty.is_dir() {
                stack.push(child);
            } else if ty.is_file() {
                out.push(child);
            } else {
                return Err(StoreError::Invalid(format!(
                    "{} is neither a file nor a folder (symlinks are not stored)",
                    root.join(&child).display()
                )));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The first line of a folder's listing.
pub const DIR_LISTING_HEADER: &[u8] = b"orchestrate.dir.v1\n";

/// One file of a folder's listing: its path relative to the folder, its
/// blake3 and its size.
pub type ListedFile = (String, String, u64);

/// A folder's sorted listing of file hashes, and the bytes a folder's hash is
/// blake3 over: the header, then `path \0 hash \0 size \n` per file.
pub fn dir_listing(root: &Path) -> Result<(Vec<ListedFile>, Vec<u8>), StoreError> {
    dir_listing_with(root, hash_file)
}

/// [`dir_listing`], each file's hash and size taken from `hash_of`.
fn dir_listing_with(
    root: &Path,
    mut hash_of: impl FnMut(&Path) -> Result<(String, u64), StoreError>,
) -> Result<(Vec<ListedFile>, Vec<u8>), StoreError> {
    let mut bytes = DIR_LISTING_HEADER.to_vec();
    let mut files = Vec::new();
    for rel in list_files(root)? {
        let (h, n) = hash_of(&root.join(&rel))?;
        let rel = rel.to_string_lossy().into_owned();
        bytes.extend_from_slice(rel.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(h.as_bytes());
        bytes.extend_from_slice(format!("\0{n}\n").as_bytes());
        files.push((rel, h, n));
    }
    Ok((files, bytes))
}

/// Hashes a folder: blake3 over its sorted listing of file hashes.
pub fn hash_dir(root: &Path) -> Result<ObjectInfo, StoreError> {
    tree_hash_with(root, hash_file)
}

fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    if skip_sync() {
        return Ok(());
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(format!("syncing {}", dir.display())))
}

/// How many [`DeferredSync`]s are alive in this process.
static DEFERRED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many syncs were left to a [`DeferredSync`] so far.
pub(crate) static SKIPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn sync_deferred() -> bool {
    DEFERRED.load(std::sync::atomic::Ordering::SeqCst) > 0
}

/// Whether a sync is left to a [`DeferredSync`] (counted, so it flushes).
fn skip_sync() -> bool {
    let deferred = sync_deferred();
    if deferred {
        SKIPPED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    deferred
}

/// Held by the tests that start a [`DeferredSync`] (a run), so the one
/// counting them sees only its own.
#[cfg(test)]
pub(crate) static DEFERRED_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `f.sync_all()`, or nothing while a [`DeferredSync`] is alive.
pub(crate) fn sync_file(f: &File) -> std::io::Result<()> {
    if skip_sync() {
        return Ok(());
    }
    f.sync_all()
}

/// Git's `core.fsyncMethod=batch` for a run: while one is alive, objects and
/// node records are written without a `fsync` each (three per node, a third
/// of a small node's time), and [`DeferredSync::finish`] makes them all
/// durable with one `syncfs` of the workspace's filesystem when the run ends.
///
/// What it changes is power loss only: a killed process leaves complete
/// nodes or nothing either way (the kernel keeps what was written), and the
/// order is kept (an object is renamed into place before the record and the
/// cache row that name it). A power cut during a run can lose the bytes of
/// objects its committed rows name; every object is checked against its hash
/// before it is read ([`super::Workspace::check_object`], `verify`), so such a
/// node runs again instead of passing a damaged output on.
pub struct DeferredSync {
    root: std::path::PathBuf,
    finished: bool,
    /// [`SKIPPED`] when it started: a run that skipped no sync (all cached)
    /// has nothing to flush.
    skipped_before: u64,
}

impl DeferredSync {
    pub fn start(root: &Path) -> DeferredSync {
        DEFERRED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let skipped_before = SKIPPED.load(std::sync::atomic::Ordering::SeqCst);
        DeferredSync { root: root.to_path_buf(), finished: false, skipped_before }
    }

    /// Flushes the workspace's filesystem (`syncfs`) if a sync was left to
    /// it: what the run wrote is durable.
    pub fn finish(mut self) -> Result<(), StoreError> {
        self.end()
    }

    fn end(&mut self) -> Result<(), StoreError> {
        self.finished = true;
        DEFERRED.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if SKIPPED.load(std::sync::atomic::Ordering::SeqCst) == self.skipped_before {
            return Ok(());
        }
        syncfs(&self.root)
    }
}

impl Drop for DeferredSync {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.end();
        }
    }
}

fn syncfs(root: &Path) -> Result<(), StoreError> {
    use std::os::fd::AsRawFd;
    let dir = File::open(root).map_err(io(format!("opening {}", root.display())))?;
    // SAFETY: a plain syscall on a descriptor that stays open for it.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(StoreError::Io {
            context: format!("syncing the filesystem of {}", root.display()),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn make_read_only(path: &Path) -> Result<(), StoreError> {
    let meta = fs::symlink_metadata(path).map_err(io(format!("reading {}", path.display())))?;
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(io(format!("listing {}", path.display())))? {
            let entry = entry.map_err(io(format!("listing {}", path.display())))?;
            make_read_only(&entry.path())?;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(0o555))
    } else {
        fs::set_permissions(path, fs::Permissions::from_mode(0o444))
    }
    .map_err(io(format!("making {} read-only", path.display())))
}

/// Copies a file into the store while hashing it (the source stays where it is).
pub fn publish_copy(objects: &Path, tmp: &Path, src: &Path) -> Result<ObjectInfo, StoreError> {
    let staged = tmp.join(format!("copy-{}", unique_suffix()));
    let mut input = File::open(src).map_err(io(format!("opening {}", src.display())))?;
    let mut out = File::create_new(&staged).map_err(io(format!("creating {}", staged.display())))?;
    // Where the filesystem clones, the store's copy shares the bytes of the
    // user's file until either is written (it is then hashed from the clone).
    // Where it cannot, the bytes are copied into the same file: a file
    // created and removed for each attempt made every later file creation
    // slower on ext4 without a journal, which skips recently freed inodes.
    if reflink(&input, &out) {
        // Synced like the copy below: install renames only complete, synced objects.
        sync_file(&out).map_err(io(format!("syncing {}", staged.display())))?;
        drop(out);
        let (hash, size) = hash_file(&staged)?;
        let info = ObjectInfo { hash, kind: OutputKind::File, size, files: 1 };
        install(objects, &staged, &info)?;
        return Ok(info);
    }
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = input.read(&mut buf).map_err(io(format!("reading {}", src.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io(format!("writing {}", staged.display())))?;
        size += n as u64;
    }
    sync_file(&out).map_err(io(format!("syncing {}", staged.display())))?;
    drop(out);
    let info = ObjectInfo { hash: hasher.finalize().to_hex().to_string(), kind: OutputKind::File, size, files: 1 };
    install(objects, &staged, &info)?;
    Ok(info)
}

/// Copies a folder from the user's tree into the store (the source stays
/// where it is); a link inside it is refused, never followed.
pub fn publish_copy_dir(objects: &Path, tmp: &Path, src: &Path) -> Result<ObjectInfo, StoreError> {
    let staged = tmp.join(format!("copy-{}", unique_suffix()));
    // Into the store: a reflink where the filesystem has them, else a copy (never a hard link to the user's file).
    let result = copy_out(src, &staged, OutputKind::Dir, &[CacheType::Reflink, CacheType::Copy])
        .and_then(|_| publish_move(objects, &staged, OutputKind::Dir));
    if result.is_err() {
        let _ = remove_any(&staged);
    }
    result
}

/// How a file is placed from the store into the user's tree (DVC's
/// `cache.type`), tried in the order given until one works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheType {
    /// A copy-on-write clone (`FICLONE`: btrfs, XFS, bcachefs; not ext4 or
    /// tmpfs): no second copy of the bytes, and an edit never reaches the store.
    Reflink,
    /// A hard link to the read-only object: no second copy; an edit needs a
    /// `chmod` first, and one made anyway is found by stat and the object set
    /// aside. Never used by root, whom a read-only mode does not stop.
    Hardlink,
    /// A plain copy: its own inode, always possible.
    Copy,
}

/// A cache type list that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheTypeError {
    #[error("'{given}' is not a cache type; expected {}", CacheTypeError::EXPECTED)]
    Unknown { given: String },
    #[error("no cache type given; expected {}", CacheTypeError::EXPECTED)]
    Empty,
}

impl CacheTypeError {
    const EXPECTED: &'static str = "reflink, hardlink or copy, comma-separated (e.g. reflink,copy)";

    fn expected(&self) -> String {
        match self {
            CacheTypeError::Unknown { given } => format!("{} ('{given}' is not one)", Self::EXPECTED),
            CacheTypeError::Empty => Self::EXPECTED.to_string(),
        }
    }
}

impl CacheType {
    /// Parses `reflink,hardlink,copy` (any order, at least one).
    pub fn parse_list(text: &str) -> Result<Vec<CacheType>, CacheTypeError> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let t = match part {
                "reflink" => CacheType::Reflink,
                "hardlink" => CacheType::Hardlink,
                "copy" => CacheType::Copy,
                other => return Err(CacheTypeError::Unknown { given: other.to_string() }),
            };
            if !out.contains(&t) {
                out.push(t);
            }
        }
        if out.is_empty() {
            return Err(CacheTypeError::Empty);
        }
        Ok(out)
    }

    /// `ORCHESTRATE_CACHE_TYPE`, or the default `reflink,copy` (as DVC's).
    pub fn from_env() -> Result<Vec<CacheType>, crate::net::EnvVarError> {
        match std::env::var("ORCHESTRATE_CACHE_TYPE") {
            Ok(v) => CacheType::parse_list(&v).map_err(|e| crate::net::EnvVarError {
                name: "ORCHESTRATE_CACHE_TYPE".into(),
                value: format!("{v:?}"),
                expected: e.expected(),
            }),
            Err(_) => Ok(vec![CacheType::Reflink, CacheType::Copy]),
        }
    }
}

/// Places a file or folder (a stored object, or a folder out of the user's
/// tree) at `to`, which must not exist, by the first of `types` that works
/// (a copy when none does): a copy or a reflink is the user's own file,
/// writable; a hard link is the read-only object itself. A link in a folder
/// is refused, never followed. Returns what was used for the last file.
pub fn copy_out(object: &Path, to: &Path, kind: OutputKind, types: &[CacheType]) -> Result<CacheType, StoreError> {
    match kind {
        OutputKind::File => place_file(object, to, types),
        OutputKind::Dir => {
            fs::create_dir(to).map_err(io(format!("creating {}", to.display())))?;
            let mut used = CacheType::Copy;
            for rel in list_files(object)? {
                let dest = to.join(&rel);
                if let Some(parent) = dest.parent() {
                    fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
                }
                used = place_file(&object.join(&rel), &dest, types)?;
            }
            Ok(used)
        }
    }
}

/// Whether this process runs as root (a read-only mode does not stop it).
fn is_root() -> bool {
    // SAFETY: a plain syscall without arguments.
    unsafe { libc::geteuid() == 0 }
}

/// Clones `input` into the empty file `out` (`FICLONE`); `false`, `out` left
/// as it was, where the filesystem cannot.
fn reflink(input: &File, out: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: FICLONE takes the source's descriptor; both stay open for the call.
    unsafe { libc::ioctl(out.as_raw_fd(), libc::FICLONE, input.as_raw_fd()) == 0 }
}

/// One regular file placed by the first cache type that works; a link where
/// the file was listed is refused.
fn place_file(from: &Path, to: &Path, types: &[CacheType]) -> Result<CacheType, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut input = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)
        .map_err(io(format!("opening {} (a symbolic link is not stored)", from.display())))?;
    // A file created for a clone that failed is copied into, not removed and
    // created again (see publish_copy).
    let mut created: Option<File> = None;
    for t in types {
        match t {
            CacheType::Hardlink if !is_root() => {
                if created.take().is_some() {
                    fs::remove_file(to).map_err(io(format!("removing {}", to.display())))?;
                }
                if fs::hard_link(from, to).is_ok() {
                    return Ok(CacheType::Hardlink);
                }
            }
            CacheType::Reflink => {
                let out = match created.take() {
                    Some(out) => out,
                    None => File::create_new(to).map_err(io(format!("creating {}", to.display())))?,
                };
                if reflink(&input, &out) {
                    return Ok(CacheType::Reflink);
                }
                created = Some(out);
            }
            CacheType::Hardlink | CacheType::Copy => {}
        }
    }
    let mut out = match created {
        Some(out) => out,
        None => File::create_new(to).map_err(io(format!("creating {}", to.display())))?,
    };
    std::io::copy(&mut input, &mut out).map_err(io(format!("copying {}", from.display())))?;
    Ok(CacheType::Copy)
}

/// The listing hash of a folder, each file's hash and size taken from
/// `hash_of` (which may use a stat cache): what its object's hash is.
pub fn tree_hash_with(
    root: &Path,
    hash_of: impl FnMut(&Path) -> Result<(String, u64), StoreError>,
) -> Result<ObjectInfo, StoreError> {
    let (files, bytes) = dir_listing_with(root, hash_of)?;
    Ok(ObjectInfo {
        hash: blake3::hash(&bytes).to_hex().to_string(),
        kind: OutputKind::Dir,
        size: files.iter().map(|f| f.2).sum(),
        files: files.len() as u64,
    })
}

/// Moves a staged file or folder (already under the store's tmp/) into the store.
pub fn publish_move(objects: &Path, staged: &Path, kind: OutputKind) -> Result<ObjectInfo, StoreError> {
    let info = match kind {
        OutputKind::File => {
            let meta = fs::metadata(staged).map_err(io(format!("reading {}", staged.display())))?;
            if !meta.is_file() {
                return Err(StoreError::Invalid(format!("{} should be a file", staged.display())));
            }
            File::open(staged).and_then(|f| sync_file(&f)).map_err(io(format!("syncing {}", staged.display())))?;
            let (hash, size) = hash_file(staged)?;
            ObjectInfo { hash, kind, size, files: 1 }
        }
        OutputKind::Dir => {
            if !staged.is_dir() {
                return Err(StoreError::Invalid(format!("{} should be a folder", staged.display())));
            }
            for rel in list_files(staged)? {
                let p = staged.join(rel);
                File::open(&p).and_then(|f| sync_file(&f)).map_err(io(format!("syncing {}", p.display())))?;
            }
            hash_dir(staged)?
        }
    };
    install(objects, staged, &info)?;
    Ok(info)
}

/// Whether the object at `path` still hashes to its name (`None`: it is not there).
pub fn intact(path: &Path, hash: &str, kind: OutputKind) -> Result<Option<bool>, StoreError> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(None);
    };
    let actual = match kind {
        OutputKind::File if meta.is_file() => hash_file(path)?.0,
        OutputKind::Dir if meta.is_dir() => match hash_dir(path) {
            Ok(info) => info.hash,
            Err(StoreError::Invalid(_)) => return Ok(Some(false)),
            Err(e) => return Err(e),
        },
        _ => return Ok(Some(false)),
    };
    Ok(Some(actual == hash))
}

/// Moves a damaged object out of the store into `damaged` (kept for
/// inspection, never read again), so its name is free for the right bytes.
/// Returns where it went, or `None` if someone else moved it first.
pub fn move_aside(object: &Path, damaged: &Path) -> Result<Option<PathBuf>, StoreError> {
    super::fsx::own_dir(damaged)?;
    let name = object.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let to = damaged.join(format!("{name}-{}", unique_suffix()));
    // A read-only folder cannot move to another parent (its `..` entry is
    // written) except by root: it is made writable to its owner first.
    if fs::symlink_metadata(object).is_ok_and(|m| m.is_dir()) {
        let _ = fs::set_permissions(object, fs::Permissions::from_mode(0o755));
    }
    match fs::rename(object, &to) {
        Ok(()) => Ok(Some(to)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::Io { context: format!("moving {} aside", object.display()), source: e }),
    }
}

/// Renames a complete, synced staged object to its content address, unless an
/// intact identical object is already there (write-once: the staged copy is
/// dropped). An object there whose bytes no longer hash to its name (bit rot,
/// a hand edit) is moved aside into `damaged/` and replaced.
fn install(objects: &Path, staged: &Path, info: &ObjectInfo) -> Result<(), StoreError> {
    let dest = objects.join(object_rel(&info.hash));
    let shard = dest.parent().expect("object paths have a shard folder");
    match intact(&dest, &info.hash, info.kind)? {
        Some(true) => {
            remove_any(staged)?;
            return Ok(());
        }
        Some(false) => {
            let damaged = objects.parent().unwrap_or(objects).join("damaged");
            move_aside(&dest, &damaged)?;
        }
        None => {}
    }
    super::fsx::own_dir(shard)?;
    // A folder's own mode is set after the rename: moving a folder to another
    // parent writes its `..` entry, which a read-only folder refuses to anyone
    // but root (so a user's folder outs could not be published at all).
    let folder = fs::symlink_metadata(staged).is_ok_and(|m| m.is_dir());
    if folder {
        for entry in fs::read_dir(staged).map_err(io(format!("listing {}", staged.display())))? {
            make_read_only(&entry.map_err(io(format!("listing {}", staged.display())))?.path())?;
        }
    } else {
        make_read_only(staged)?;
    }
    match fs::rename(staged, &dest) {
        Ok(()) => {}
        // Another process installed the same content first: equally good.
        Err(_) if dest.exists() => {
            remove_any(staged)?;
            return Ok(());
        }
        Err(e) => return Err(StoreError::Io { context: format!("publishing {}", dest.display()), source: e }),
    }
    if folder {
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o555))
            .map_err(io(format!("making {} read-only", dest.display())))?;
    }
    fsync_dir(shard)
}

/// Removes a file or folder, read-only ones included.
pub fn remove_any(path: &Path) -> Result<(), StoreError> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    if meta.is_dir() {
        // Folders were made read-only: restore write permission to delete their entries.
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
        for entry in fs::read_dir(path).map_err(io(format!("listing {}", path.display())))? {
            let entry = entry.map_err(io(format!("listing {}", path.display())))?;
            remove_any(&entry.path())?;
        }
        fs::remove_dir(path).map_err(io(format!("removing {}", path.display())))
    } else {
        fs::remove_file(path).map_err(io(format!("removing {}", path.display())))
    }
}

/// A name no other process or thread will pick.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{}-{}", std::process::id(), nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_file_syncs_are_deferred_while_a_run_holds_a_deferred_sync() {
        let _serial = DEFERRED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        // Other tests in this process may hold one: count relative to now.
        let before = DEFERRED.load(std::sync::atomic::Ordering::SeqCst);
        let (a, b) = (DeferredSync::start(dir.path()), DeferredSync::start(dir.path()));
        assert_eq!(DEFERRED.load(std::sync::atomic::Ordering::SeqCst), before + 2);
        assert!(sync_deferred());
        a.finish().unwrap();
        drop(b);
        assert_eq!(DEFERRED.load(std::sync::atomic::Ordering::SeqCst), before);
        // A sync left to it is made at the end (here failing: the root is gone).
        let gone = dir.path().join("gone");
        let deferred = DeferredSync::start(&gone);
        sync_file(&File::open(dir.path()).unwrap()).unwrap();
        let err = deferred.finish().unwrap_err().to_string();
        assert!(err.contains("gone"), "{err}");
    }

    #[test]
    fn cache_types_parse_in_order_and_a_wrong_one_is_named() {
        assert_eq!(CacheType::parse_list("hardlink, copy,hardlink").unwrap(), [CacheType::Hardlink, CacheType::Copy]);
        assert!(CacheType::parse_list("symlink,copy")
            .unwrap_err()
            .to_string()
            .contains("'symlink' is not a cache type"));
        assert!(CacheType::parse_list(" , ").is_err());
        // Where the filesystem has no reflinks (ext4, tmpfs), a copy is made.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"bytes").unwrap();
        let used = copy_out(
            &dir.path().join("a"),
            &dir.path().join("b"),
            OutputKind::File,
            &[CacheType::Reflink, CacheType::Copy],
        )
        .unwrap();
        assert!(matches!(used, CacheType::Reflink | CacheType::Copy));
        assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"bytes");
    }

    #[test]
    fn a_folder_hash_depends_on_names_and_contents_not_on_creation_order() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        fs::create_dir_all(a.join("sub")).unwrap();
        fs::create_dir_all(b.join("sub")).unwrap();
        fs::write(a.join("x"), "1").unwrap();
        fs::write(a.join("sub/y"), "2").unwrap();
        fs::write(b.join("sub/y"), "2").unwrap();
        fs::write(b.join("x"), "1").unwrap();
        assert_eq!(hash_dir(&a).unwrap(), hash_dir(&b).unwrap());
        fs::write(b.join("x"), "3").unwrap();
        assert_ne!(hash_dir(&a).unwrap().hash, hash_dir(&b).unwrap().hash);
    }

    #[test]
    fn publishing_the_same_bytes_twice_keeps_one_read_only_object() {
        let t = tempfile::tempdir().unwrap();
        let (objects, tmp) = (t.path().join("objects"), t.path().join("tmp"));
        fs::create_dir_all(&objects).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let src = t.path().join("src.txt");
        fs::write(&src, "hello").unwrap();
        let one = publish_copy(&objects, &tmp, &src).unwrap();
        let two = publish_copy(&objects, &tmp, &src).unwrap();
        assert_eq!(one, two);
        let dest = objects.join(object_rel(&one.hash));
        assert_eq!(fs::read_to_string(&dest).unwrap(), "hello");
        assert!(fs::metadata(&dest).unwrap().permissions().readonly());
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0, "staged copies are cleaned up");
    }
}
