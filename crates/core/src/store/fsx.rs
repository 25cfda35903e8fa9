//! The workspace's own files and folders, opened without following links.
//!
//! Everything under a workspace root is ours: made by us, as real folders and
//! regular files. A symbolic link found where one of ours should be (planted,
//! or left by a tool) is refused, never followed: following it would let a
//! cleanup empty, or a write land in, a folder that belongs to someone else.
//! Folders are made with `mkdir` (which never follows a final link) and
//! checked with `lstat`; files are opened with `O_NOFOLLOW`, and fresh ones
//! with `O_EXCL` (std's `File::create_new`).

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::StoreError;

/// Makes `path` a real folder of ours, or checks that it is one: a link (to
/// anything) or a file there is an error naming it. Missing parents are made
/// the same way, up to the first that exists.
pub fn own_dir(path: &Path) -> Result<(), StoreError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) if meta.file_type().is_symlink() => Err(refused_link(path)),
        Ok(_) => Err(StoreError::Invalid(format!(
            "{} is not a folder: the workspace keeps its own folder there (move it away)",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                if fs::symlink_metadata(parent).is_err() {
                    own_dir(parent)?;
                }
            }
            match fs::create_dir(path) {
                Ok(()) => Ok(()),
                // Another process made it first: check what it made.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match fs::symlink_metadata(path) {
                    Ok(meta) if meta.is_dir() => Ok(()),
                    _ => Err(refused_link(path)),
                },
                Err(e) => Err(StoreError::Io { context: format!("creating {}", path.display()), source: e }),
            }
        }
        Err(e) => Err(StoreError::Io { context: format!("reading {}", path.display()), source: e }),
    }
}

fn refused_link(path: &Path) -> StoreError {
    StoreError::Invalid(format!(
        "{} is a symbolic link (or not a folder) where orchestrate keeps a folder of its own: it never follows \
         a link out of the folders it writes. Remove the link (rm {}) and run again",
        path.display(),
        path.display()
    ))
}

/// The folder of locks every orchestrate process of this user on this
/// machine shares, whatever workspace it uses: the CPU slots (`slot-N`) and
/// the outs lock (`outs.lock`, see [`super::Workspace::lock_outs`]).
/// `ORCHESTRATE_CPU_SLOTS_DIR`, else `orchestrate-cpu-UID` in the temp
/// folder, made with mode 0700. Found once per process; `None` where it cannot
/// be used (a link, not a folder, another user's), said once on stderr: then
/// the slots and out locks are this process's and its workspace's own.
pub fn machine_dir() -> Option<&'static Path> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        // SAFETY: getuid cannot fail and touches no memory.
        let uid = unsafe { libc::getuid() };
        let dir = match std::env::var_os("ORCHESTRATE_CPU_SLOTS_DIR") {
            Some(d) => PathBuf::from(d),
            None => std::env::temp_dir().join(format!("orchestrate-cpu-{uid}")),
        };
        checked_machine_dir(dir)
            .map_err(|why| {
                eprintln!(
                    "note: CPU slots and out locks are this run's own, not shared with other runs on this machine: {why}"
                )
            })
            .ok()
    })
    .as_deref()
}

/// `dir`, made if absent, if it is a folder of this user's (never a link).
pub fn checked_machine_dir(dir: PathBuf) -> Result<PathBuf, MachineDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(MachineDirError::Io { dir, source }),
    }
    let meta = match fs::symlink_metadata(&dir) {
        Ok(meta) => meta,
        Err(source) => return Err(MachineDirError::Io { dir, source }),
    };
    if !meta.is_dir() {
        return Err(MachineDirError::NotAFolder { dir });
    }
    if meta.uid() != uid {
        return Err(MachineDirError::NotOurs { dir });
    }
    Ok(dir)
}

/// Why the machine's folder of locks is not used.
#[derive(Debug, thiserror::Error)]
pub enum MachineDirError {
    #[error("{}: {source}", .dir.display())]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a folder (a link is never followed)", .dir.display())]
    NotAFolder { dir: PathBuf },
    #[error("{} belongs to another user", .dir.display())]
    NotOurs { dir: PathBuf },
}

/// Opens (creating it if needed) a lock file without truncating it and
/// without following a link there.
pub fn open_lock(path: &Path) -> std::io::Result<File> {
    said(OpenOptions::new().write(true).create(true).truncate(false).custom_flags(libc::O_NOFOLLOW).open(path))
}

/// Takes an exclusive open-file-description lock (`F_OFD_SETLK`) on the
/// byte at `offset` of `file`: `Ok(true)` when taken, `Ok(false)` when
/// another open of the file holds it and `wait` is false; with `wait`, blocks
/// until it is free. It is released when `file` is closed (the process dying
/// closes it).
pub fn lock_byte(file: &File, offset: i64, wait: bool) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value; its fields are set below.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = libc::F_WRLCK as libc::c_short;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    range.l_start = offset;
    range.l_len = 1;
    let command = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    loop {
        // SAFETY: fcntl on a descriptor `file` owns, with a valid `flock`.
        if unsafe { libc::fcntl(file.as_raw_fd(), command, &range) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) if !wait => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// [`lock_byte`] that waits by polling (every 1 ms at first, at most every
/// 100 ms) so that `stop` can end the wait: `Ok(false)` when it did. A
/// blocking wait cannot be ended from another thread (a signal reaches
/// whichever thread it reaches, and an interrupted wait is resumed).
pub fn lock_byte_until(file: &File, offset: i64, stop: &dyn Fn() -> bool) -> std::io::Result<bool> {
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        if lock_byte(file, offset, false)? {
            return Ok(true);
        }
        if stop() {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// `O_NOFOLLOW`'s refusal (`ELOOP`, "too many levels of symbolic links") said as what it is.
fn said(opened: std::io::Result<File>) -> std::io::Result<File> {
    opened.map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            std::io::Error::new(
                e.kind(),
                "it is a symbolic link, and orchestrate never opens its own files through a link: remove it and run again",
            )
        } else {
            e
        }
    })
}

/// Opens a file of ours for appending (a log), creating it if needed; a link
/// there is an error (`ELOOP`), never followed.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    said(OpenOptions::new().append(true).create(true).custom_flags(libc::O_NOFOLLOW).open(path))
}

/// Opens a file of ours for writing from the start, creating it if needed
/// (truncating only a regular file of ours; a link is an error, never followed).
pub fn open_truncate(path: &Path) -> std::io::Result<File> {
    said(OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_NOFOLLOW).open(path))
}

/// `std::fs::write` for a file of ours ([`open_truncate`]): a link where it
/// is to be written is an error, and what the link points to is untouched.
pub fn write_file(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    std::io::Write::write_all(&mut open_truncate(path)?, bytes.as_ref())
}

/// `std::fs::copy` into a file of ours ([`open_truncate`]): the copy is never
/// written through a link planted at `to`. (`from` is opened as given.)
pub fn copy_file(from: &Path, to: &Path) -> std::io::Result<u64> {
    std::io::copy(&mut File::open(from)?, &mut open_truncate(to)?)
}

/// Whether `name` has the form of a staging entry this store creates
/// (`objects::unique_suffix`: `<pid>-<nanos>-<counter>`, digits only), with or
/// without the `.lock` extension. Cleanups remove nothing else.
pub fn is_staging_name(name: &str) -> bool {
    let stem = name.strip_suffix(".lock").unwrap_or(name);
    let parts: Vec<&str> = stem.split('-').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.len() <= 40 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The temporary name a checkout copies the out `dest` to before renaming
/// it into place: `.NAME.orchestrate-SUFFIX` beside it.
pub fn checkout_temp(dest: &Path, suffix: &str) -> PathBuf {
    dest.with_file_name(format!(".{}.orchestrate-{suffix}", dest.file_name().unwrap_or_default().to_string_lossy()))
}

/// Whether `name` is one [`checkout_temp`] gives (`.NAME.orchestrate-`
/// and a staging suffix): a copy of an out on its way into place, or left
/// by a killed checkout, never the user's data.
pub fn is_checkout_temp_name(name: &str) -> bool {
    name.starts_with('.')
        && name.rsplit_once(".orchestrate-").is_some_and(|(stem, suffix)| stem.len() > 1 && is_staging_name(suffix))
}

/// Removes copies of the out `dest` that a killed checkout left beside it
/// ([`checkout_temp`] names with a staging suffix, and nothing else; a link
/// is removed as a link). Call it holding the out's lock
/// ([`super::Workspace::lock_outs`]): no live checkout is writing one then.
pub fn remove_checkout_leftovers(dest: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dest.parent(), dest.file_name()) else { return Ok(()) };
    let prefix = format!(".{}.orchestrate-", name.to_string_lossy());
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        if entry_name.strip_prefix(&prefix).is_some_and(is_staging_name) {
            super::objects::remove_any(&entry.path()).map_err(|e| std::io::Error::other(e.to_string()))?;
        }
    }
    Ok(())
}

/// The first link on the way from `root` to `root/rel` (its folders and
/// `rel` itself), if any: nothing is removed or written through one.
pub fn link_on_path(root: &Path, rel: &str) -> Option<std::path::PathBuf> {
    let mut at = root.to_path_buf();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(at);
        }
    }
    None
}

/// Removes a node's declared out `root/rel` whole (a file, or a folder with
/// all it holds), as DVC removes an out before its stage runs. A link is
/// removed as a link; a link among its folders is refused, so nothing outside
/// `root` is ever removed. `Ok(false)`: there was nothing to remove.
pub fn remove_out(root: &Path, rel: &str) -> std::io::Result<bool> {
    let path = root.join(rel);
    if let Some(link) = link_on_path(root, rel) {
        if link == path {
            std::fs::remove_file(&path)?;
            return Ok(true);
        }
        return Err(std::io::Error::other(format!(
            "{} is a symbolic link; the out '{rel}' is not removed or written through it",
            link.display()
        )));
    }
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => {
            if let Some(kept) = kept_within(&path)? {
                return Err(std::io::Error::other(format!(
                    "{kept} inside the out '{rel}': the out is not removed, so {} is kept. Move it out of the \
                     folder (or remove the folder yourself) and run again",
                    kept.what()
                )));
            }
            super::objects::remove_any(&path).map_err(|e| std::io::Error::other(e.to_string()))?;
            Ok(true)
        }
        Ok(_) => std::fs::remove_file(&path).map(|()| true),
    }
}

/// What a folder holds that removing it whole would destroy and that is
/// never an out's to remove: a workspace, or another tool's folder (a
/// repository's `.git`, a submodule's `.git` file, `.dvc`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// An orchestrate workspace ([`super::is_workspace`]).
    Workspace(PathBuf),
    /// A name [`reserved_folder`] gives to a tool: whose it is.
    Reserved { path: PathBuf, whose: &'static str },
}

impl Kept {
    /// What keeping it keeps, for a message.
    pub fn what(&self) -> &'static str {
        match self {
            Kept::Workspace(_) => "that store",
            Kept::Reserved { .. } => "what it holds",
        }
    }
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kept::Workspace(at) => write!(f, "{} is an orchestrate workspace", at.display()),
            Kept::Reserved { path, whose } => write!(f, "{} is {whose}", path.display()),
        }
    }
}

/// The first [`Kept`] at or under the folder `dir`, links not followed:
/// what removing the folder would destroy that no out may hold.
pub fn kept_within(dir: &Path) -> std::io::Result<Option<Kept>> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        let mut marked = false;
        let mut reserved = None;
        for entry in std::fs::read_dir(&at)? {
            let entry = entry?;
            let name = entry.file_name();
            if name == super::MARKER {
                marked = true;
            } else if let Some(whose) = name.to_str().and_then(reserved_folder) {
                reserved.get_or_insert((entry.path(), whose));
            } else if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            }
        }
        if marked && super::is_workspace(&at) {
            return Ok(Some(Kept::Workspace(at)));
        }
        if let Some((path, whose)) = reserved {
            if super::is_workspace(&path) {
                return Ok(Some(Kept::Workspace(path)));
            }
            return Ok(Some(Kept::Reserved { path, whose }));
        }
    }
    Ok(None)
}

/// A path the user named for a command's own output (`report --out`, an
/// export or pack folder) that lies in an orchestrate workspace.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} lies inside the orchestrate workspace {}: {what} is never written into a workspace (it would replace \
     the store's objects or index). Write it elsewhere",
    .path.display(),
    .workspace.display()
)]
pub struct InsideWorkspace {
    pub path: PathBuf,
    pub workspace: PathBuf,
    pub what: &'static str,
}

/// Refuses `path` (to be written, and perhaps not there yet) when it, or a
/// folder above it, is an orchestrate workspace ([`super::is_workspace`]),
/// by real paths: the nearest part of it that exists is resolved, links and
/// `..` included. `what` names the output for the message.
pub fn refuse_inside_workspace(path: &Path, what: &'static str) -> Result<(), InsideWorkspace> {
    let mut existing = path.to_path_buf();
    while std::fs::symlink_metadata(&existing).is_err() {
        match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => existing = p.to_path_buf(),
            _ => {
                existing = PathBuf::from(".");
                break;
            }
        }
    }
    let Ok(real) = existing.canonicalize() else { return Ok(()) };
    for dir in real.ancestors() {
        if super::is_workspace(dir) {
            return Err(InsideWorkspace { path: path.to_path_buf(), workspace: dir.to_path_buf(), what });
        }
    }
    Ok(())
}

/// Why a user's file was not opened; each names the file as the user wrote it.
#[derive(Debug, thiserror::Error)]
pub enum UserFileError {
    #[error("'{rel}': {} is a symbolic link; the user's files are read from real files only", .link.display())]
    Link { rel: String, link: PathBuf },
    #[error("'{rel}' cannot be read ({}): {source}", .path.display())]
    Open {
        rel: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{rel}' is not a regular file")]
    NotAFile { rel: String },
}

/// Opens `root/rel`, a user's file, for reading: a relative path inside
/// `root`, no link on the way (checked, and `O_NOFOLLOW` on the last part),
/// a regular file. Errors name `rel` and say what was expected.
pub fn open_user_file(root: &Path, rel: &str) -> Result<std::fs::File, UserFileError> {
    if let Some(link) = link_on_path(root, rel) {
        return Err(UserFileError::Link { rel: rel.to_string(), link });
    }
    let path = root.join(rel);
    match crate::fsread::open_regular(&path, libc::O_NOFOLLOW) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Err(UserFileError::NotAFile { rel: rel.to_string() }),
        Err(source) => Err(UserFileError::Open { rel: rel.to_string(), path, source }),
    }
}

/// Folders that belong to orchestrate or to another tool (version control,
/// DVC, Snakemake), by name, with whose they are: a dep walk never enters
/// one, and no node's out may be one or lie inside one (an out is removed
/// whole before its command runs, as DVC removes it). Case aside: on a
/// case-insensitive disk (macOS's default) `.Git` is `.git`.
pub fn reserved_folder(name: &str) -> Option<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        ".orchestrate" => Some("orchestrate's own folder"),
        ".git" | ".hg" | ".svn" | ".jj" => Some("version control's folder"),
        ".dvc" => Some("DVC's folder"),
        ".snakemake" => Some("Snakemake's folder"),
        _ => None,
    }
}

/// An out that the workspace in use forbids.
#[derive(Debug, thiserror::Error)]
pub enum OutOverWorkspace {
    #[error(
        "out '{out}' holds the workspace in use ({}): removing the out before its command runs would remove the \
         store with it. Use a workspace outside the node's outs (--workspace), or run from the spec's folder",
        .workspace.display()
    )]
    Holds { out: String, workspace: PathBuf },
    #[error(
        "out '{out}' lies inside the workspace in use ({}): a node never writes into orchestrate's store. \
         Declare an out outside it",
        .workspace.display()
    )]
    Inside { out: String, workspace: PathBuf },
    #[error("resolving {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The real paths of a spec's folder and of the workspace in use, to check
/// outs against without resolving either again per node.
#[derive(Debug, Clone)]
pub struct OutsBeside {
    dir: PathBuf,
    workspace: PathBuf,
}

impl OutsBeside {
    pub fn new(spec_dir: &Path, workspace: &Path) -> Result<OutsBeside, OutOverWorkspace> {
        let real = |path: &Path| {
            path.canonicalize().map_err(|source| OutOverWorkspace::Io { path: path.to_path_buf(), source })
        };
        Ok(OutsBeside { dir: real(spec_dir)?, workspace: real(workspace)? })
    }

    /// Refuses the first of `outs` (normalized, relative to the spec's
    /// folder) that holds the workspace or lies inside it. Both folders are
    /// real paths and an out is never reached through a link ([`remove_out`]
    /// refuses one), so the comparison is lexical, by whole folder names.
    pub fn check<'a>(&self, outs: impl IntoIterator<Item = &'a String>) -> Result<(), OutOverWorkspace> {
        // By bytes: `Path::starts_with` walks components, a tenth of a
        // validate of 10,000 nodes' own work here.
        let under = |path: &[u8], dir: &[u8]| {
            path.strip_prefix(dir).is_some_and(|rest| rest.is_empty() || rest[0] == b'/' || dir.ends_with(b"/"))
        };
        let workspace = self.workspace.as_os_str().as_encoded_bytes();
        for out in outs {
            let path = self.dir.join(out);
            let path = path.as_os_str().as_encoded_bytes();
            let holds = under(workspace, path);
            if holds || under(path, workspace) {
                let (out, workspace) = (out.clone(), self.workspace.clone());
                return Err(if holds {
                    OutOverWorkspace::Holds { out, workspace }
                } else {
                    OutOverWorkspace::Inside { out, workspace }
                });
            }
        }
        Ok(())
    }
}

/// Whether the relative path `path` lies inside the folder `dir` (both
/// normalized, [`normalize_rel`]): `data/a.txt` inside `data`, not `data2/a.txt`.
pub fn inside(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `path` is `dir` itself or lies inside it ([`inside`]).
pub fn at_or_inside(path: &str, dir: &str) -> bool {
    path == dir || inside(path, dir)
}

/// The folder holding the relative path `rel` (`""` for one at the top):
/// `src` for `src/train.py`.
pub fn parent_rel(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Whether `path` is a relative path [`normalize_rel`] leaves as it is:
/// `d/x.txt`, `train.py`, not `./x`, `a//b`, `a/`, `../x` or `/x`.
pub fn is_normal_rel(path: &str) -> bool {
    !path.is_empty() && path.as_bytes().split(|b| *b == b'/').all(|p| !p.is_empty() && p != b"." && p != b"..")
}

/// Lexically normalizes a relative path (`./a/../b` → `b`) so deps and outs
/// written differently still match; `None` if it escapes upward or is absolute.
pub fn normalize_rel(path: &str) -> Option<String> {
    // Most paths are normal already (`d/x.txt`): a copy, with no split.
    if is_normal_rel(path) {
        return Some(path.to_string());
    }
    let mut parts: Vec<&str> = Vec::new();
    if path.starts_with('/') {
        return None;
    }
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_folders_are_known_by_whole_name_case_aside() {
        for name in [".git", ".Git", ".GIT", ".orchestrate", ".DVC", ".snakemake", ".hg", ".svn", ".jj"] {
            assert!(reserved_folder(name).is_some(), "{name}");
        }
        for name in [".github", "git", "x.git", ".gitignore", "orchestrate", ".dvcignore", ""] {
            assert!(reserved_folder(name).is_none(), "{name}");
        }
    }

    #[test]
    fn an_out_over_the_workspace_is_found_by_whole_folder_names_on_real_paths() {
        let t = tempfile::tempdir().unwrap();
        let (dir, ws) = (t.path().join("project"), t.path().join("project/sub/ws"));
        fs::create_dir_all(&ws).unwrap();
        let beside = OutsBeside::new(&dir, &ws).unwrap();
        let one = |out: &str| beside.check([&out.to_string()]);
        assert!(matches!(one("sub"), Err(OutOverWorkspace::Holds { .. })));
        assert!(matches!(one("sub/ws"), Err(OutOverWorkspace::Holds { .. })));
        assert!(matches!(one("sub/ws/objects"), Err(OutOverWorkspace::Inside { .. })));
        assert!(one("su").is_ok(), "a prefix of a name is another folder");
        assert!(one("sub/wsx").is_ok());
        assert!(one("other").is_ok());
        // The spec's folder reached through a link, the workspace by its real path.
        std::os::unix::fs::symlink(&dir, t.path().join("alias")).unwrap();
        let beside = OutsBeside::new(&t.path().join("alias"), &ws).unwrap();
        let e = beside.check([&"out".to_string(), &"sub".to_string()]).unwrap_err();
        assert!(matches!(&e, OutOverWorkspace::Holds { out, .. } if out == "sub"), "{e}");
        assert!(beside.check([&"out".to_string(), &"subway".to_string()]).is_ok());
        assert!(matches!(OutsBeside::new(&t.path().join("absent"), &ws), Err(OutOverWorkspace::Io { .. })));
    }

    #[test]
    fn own_dir_makes_real_folders_and_refuses_links_to_anything() {
        let t = tempfile::tempdir().unwrap();
        own_dir(&t.path().join("a/b/c")).unwrap();
        assert!(fs::symlink_metadata(t.path().join("a/b/c")).unwrap().is_dir());
        fs::create_dir(t.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere"), t.path().join("linked")).unwrap();
        std::os::unix::fs::symlink(t.path().join("nowhere"), t.path().join("dangling")).unwrap();
        for bad in ["linked", "dangling"] {
            let err = own_dir(&t.path().join(bad)).unwrap_err().to_string();
            assert!(err.contains("symbolic link"), "{bad}: {err}");
        }
        assert!(!t.path().join("nowhere").exists(), "a dangling link's target is never created");
    }

    /// A FIFO (or a device) planted where a user's file is read: the open
    /// returns at once and the file is refused, instead of waiting forever
    /// for a writer that never comes.
    #[test]
    fn a_fifo_where_a_users_file_is_read_is_refused_without_waiting_for_a_writer() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("params.yaml");
        crate::fsread::mkfifo(&fifo);
        let (tx, rx) = std::sync::mpsc::channel();
        let root = t.path().to_path_buf();
        std::thread::spawn(move || {
            let user = open_user_file(&root, "params.yaml").map(|_| ()).map_err(|e| e.to_string());
            let ours = crate::store::hash_file(&root.join("params.yaml")).map(|_| ()).map_err(|e| e.to_string());
            tx.send((user, ours)).unwrap();
        });
        let (user, ours) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a FIFO waited for a writer instead of refusing it");
        assert_eq!(user.unwrap_err(), "'params.yaml' is not a regular file");
        assert!(ours.unwrap_err().ends_with("params.yaml: not a regular file"));
        // A regular file still opens, and reads as it did.
        fs::write(t.path().join("real.yaml"), "a: 1\n").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut open_user_file(t.path(), "real.yaml").unwrap(), &mut text).unwrap();
        assert_eq!(text, "a: 1\n");
    }

    #[test]
    fn files_of_ours_are_never_opened_through_a_link() {
        let t = tempfile::tempdir().unwrap();
        let theirs = t.path().join("theirs.txt");
        fs::write(&theirs, "keep me").unwrap();
        let link = t.path().join("ours.log");
        std::os::unix::fs::symlink(&theirs, &link).unwrap();
        let err = open_append(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(open_truncate(&link).is_err());
        assert!(open_lock(&link).is_err());
        // std's File::create_new is O_EXCL: a link there, dangling or not, is an error.
        assert!(File::create_new(&link).is_err());
        // An output written or copied where a link was planted.
        assert!(write_file(&link, "output").unwrap_err().to_string().contains("symbolic link"));
        let source = t.path().join("source.json");
        fs::write(&source, "{}").unwrap();
        assert!(copy_file(&source, &link).is_err());
        assert_eq!(fs::read_to_string(&theirs).unwrap(), "keep me");
        // Where nothing is planted, both write the file whole.
        write_file(&t.path().join("out"), "one").unwrap();
        copy_file(&source, &t.path().join("copied")).unwrap();
        assert_eq!(fs::read_to_string(t.path().join("copied")).unwrap(), "{}");
        write_file(&t.path().join("out"), "2").unwrap();
        assert_eq!(fs::read_to_string(t.path().join("out")).unwrap(), "2", "truncated, not overwritten in place");
    }

    #[test]
    fn only_our_staging_names_are_recognised() {
        assert!(is_staging_name("4242-1700000000000000000-0"));
        assert!(is_staging_name("4242-1-0.lock"));
        for other in ["notes.txt", "4242-1", "a-b-c", "4242-1-0-9", "-1-0", "4242-1-0.txt", ".4242-1-0"] {
            assert!(!is_staging_name(other), "{other}");
        }
    }
}
