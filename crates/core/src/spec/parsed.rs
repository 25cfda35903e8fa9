//! The parse cache: each spec file's YAML, parsed, kept in the workspace by
//! the hash of its bytes, so that a command reading an unchanged spec again
//! (a no-op `run`, `plan`) reads JSON instead of parsing YAML (of a 200-node
//! spec's no-op, the YAML parse was the largest single cost, about 1.3 ms).
//!
//! What is kept is a pure function of the file's bytes: the document after
//! YAML merge keys are applied, as [`super::load`] reads it before it merges
//! `extends`, profiles and `--set` (none of which is cached). An entry is
//! named by the blake3 of the parser's identity (this executable: its version,
//! size and modification time, so any other build parses afresh) and the
//! text, and holds the blake3 of its JSON before the JSON: an entry that was
//! cut short, changed on disk or made by another build is never read; the
//! file is then parsed as if there were no cache. Only a text that parsed
//! without error is kept, so every error is said as the parser says it.
//!
//! The same folder keeps one more kind of entry: that the params of a spec's
//! nodes passed the params' schema check (about 0.7 ms of the same no-op, most
//! of it jsonschema compiling its meta-schema), named by the blake3 of the
//! executable's identity and the nodes' ops and params, so that only the very
//! params checked before, by the very executable, skip it.
//!
//! Entries are read without following a link, bounded in size, and written
//! only by [`ParseCache::save`] into the workspace's own `specs/` folder once
//! the workspace is open (a link or a file there is refused, as for every
//! folder of the workspace); at most [`KEEP`] are kept, the oldest removed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use crate::store::{fsx, write_atomic, StoreError};

/// The folder of the workspace the entries are kept in.
pub const FOLDER: &str = "specs";

/// The field of an entry noting a passed params check.
const PARAMS_CHECKED: &str = "params_checked";

/// The most entries kept: each is one version of one spec file, or one
/// passed params check.
pub const KEEP: usize = 64;

/// The largest entry read or written (a spec is at most
/// [`super::load::MAX_SPEC_BYTES`]; YAML aliases can make its JSON larger).
pub const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// The parse cache of one workspace, for one command.
#[derive(Debug)]
pub struct ParseCache {
    dir: PathBuf,
    /// The blake3 of what the parse depends on besides the text (`None`: this
    /// executable cannot be identified, and nothing is read or kept).
    parser: Option<[u8; 32]>,
    /// Texts parsed during this command that had no entry: (entry name, bytes).
    misses: Mutex<Vec<(String, Vec<u8>)>>,
}

impl ParseCache {
    /// The cache in `workspace/specs` (nothing is read or made yet).
    pub fn new(workspace: &Path) -> ParseCache {
        let workspace = std::path::absolute(workspace).unwrap_or_else(|_| workspace.to_path_buf());
        ParseCache { dir: workspace.join(FOLDER), parser: parser_identity(), misses: Mutex::new(Vec::new()) }
    }

    fn entry_name(&self, text: &str) -> Option<String> {
        self.name_of(b"orchestrate spec parse cache 1\0", |h| {
            h.update(text.as_bytes());
        })
    }

    /// An entry's name: the blake3 of `domain`, this parser's identity and
    /// what `content` hashes.
    fn name_of(&self, domain: &[u8], content: impl FnOnce(&mut blake3::Hasher)) -> Option<String> {
        let parser = self.parser?;
        let mut h = blake3::Hasher::new();
        h.update(domain);
        h.update(&parser);
        content(&mut h);
        Some(format!("{}.json", h.finalize().to_hex()))
    }

    /// The name of the entry noting that these nodes' params passed the
    /// params' schema check ([`super::schema::check_constraints`]): their ops
    /// and params, exactly as written in JSON (1.0 is not 1 here), with this
    /// executable (whose schemas they were checked against).
    pub fn params_checked_name(&self, nodes: &[super::NodeDef]) -> Option<String> {
        self.name_of(b"orchestrate params checked 1\0", |h| {
            for def in nodes {
                h.update(def.op.as_bytes());
                h.update(b"\0");
                serde_json::to_writer(&mut *h, &def.params).expect("JSON params serialize into a hasher");
                h.update(b"\n");
            }
        })
    }

    /// Whether the check named by [`ParseCache::params_checked_name`] passed
    /// before (a sound entry says so). The cache is trusted as for parses: an
    /// entry that could say so falsely could as well hold another document.
    pub fn params_checked(&self, name: &str) -> bool {
        self.read_entry(name).is_some_and(|doc| doc.get(PARAMS_CHECKED).is_some())
    }

    /// Notes that the check named `name` passed, to be kept by [`ParseCache::save`].
    pub fn remember_params_checked(&self, name: String, nodes: usize) {
        self.keep(name, &serde_json::json!({ PARAMS_CHECKED: nodes }));
    }

    /// The parsed document kept for `text`, if a sound entry is there.
    pub(super) fn get(&self, text: &str) -> Option<Value> {
        let name = self.entry_name(text)?;
        self.read_entry(&name)
    }

    /// The document of the entry `name`, if a sound one is there.
    fn read_entry(&self, name: &str) -> Option<Value> {
        // The folder itself must be ours: a link there is never read through.
        if !std::fs::symlink_metadata(&self.dir).is_ok_and(|m| m.is_dir()) {
            return None;
        }
        let file = crate::fsread::open_regular(&self.dir.join(name), libc::O_NOFOLLOW).ok()?;
        let bytes = crate::fsread::read_opened(file, MAX_ENTRY_BYTES).ok()?;
        let (sum, json) = bytes.split_at_checked(64)?;
        let json = json.strip_prefix(b"\n")?;
        if blake3::hash(json).to_hex().as_bytes() != sum {
            return None;
        }
        serde_json::from_slice::<Value>(json).ok().filter(Value::is_object)
    }

    /// Notes `doc` as what `text` parses to, to be kept by [`ParseCache::save`].
    pub(super) fn remember(&self, text: &str, doc: &Value) {
        let Some(name) = self.entry_name(text) else { return };
        self.keep(name, doc);
    }

    fn keep(&self, name: String, doc: &Value) {
        let Ok(json) = serde_json::to_vec(doc) else { return };
        if json.len() as u64 + 65 > MAX_ENTRY_BYTES {
            return;
        }
        let mut bytes = Vec::with_capacity(json.len() + 65);
        bytes.extend_from_slice(blake3::hash(&json).to_hex().as_bytes());
        bytes.push(b'\n');
        bytes.extend_from_slice(&json);
        self.misses.lock().expect("parse cache").push((name, bytes));
    }

    /// Writes the entries this command parsed, into the workspace's
    /// `specs/` folder (made if missing; a link or a file there is an
    /// error), each whole or not at all, then removes the oldest beyond
    /// [`KEEP`]. Call it once the workspace is open (known to be ours).
    /// Returns how many entries were written.
    pub fn save(&self) -> Result<usize, StoreError> {
        let misses = std::mem::take(&mut *self.misses.lock().expect("parse cache"));
        if misses.is_empty() {
            return Ok(0);
        }
        fsx::own_dir(&self.dir)?;
        for (name, bytes) in &misses {
            let path = self.dir.join(name);
            write_atomic(&path, bytes)
                .map_err(|e| StoreError::Io { context: format!("writing {}", path.display()), source: e })?;
        }
        let written: Vec<&str> = misses.iter().map(|(name, _)| name.as_str()).collect();
        self.prune(&written)?;
        Ok(misses.len())
    }

    /// Removes the oldest entries beyond [`KEEP`], never those just written
    /// (file times are coarse: several entries can share one): only files
    /// named as entries are, never anything else in the folder.
    fn prune(&self, written: &[&str]) -> Result<(), StoreError> {
        let listing = std::fs::read_dir(&self.dir)
            .map_err(|e| StoreError::Io { context: format!("listing {}", self.dir.display()), source: e })?;
        let mut entries: Vec<(std::time::SystemTime, PathBuf)> = listing
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                is_entry_name(&name) && !written.contains(&name.as_str())
            })
            .filter_map(|e| {
                let meta = std::fs::symlink_metadata(e.path()).ok().filter(|m| m.is_file())?;
                Some((meta.modified().ok()?, e.path()))
            })
            .collect();
        let room = KEEP.saturating_sub(written.len());
        if entries.len() <= room {
            return Ok(());
        }
        entries.sort();
        for (_, path) in &entries[..entries.len() - room] {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                // Another command pruned it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::Io { context: format!("removing {}", path.display()), source: e }),
            }
        }
        Ok(())
    }
}

/// `<64 hex digits>.json`: the name of an entry.
fn is_entry_name(name: &str) -> bool {
    name.strip_suffix(".json").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What parsing depends on besides the text: this crate's version and the
/// running executable (its size and modification time: a rebuild, with
/// another YAML crate or another version of this code, is another parser).
fn parser_identity() -> Option<[u8; 32]> {
    use std::os::unix::fs::MetadataExt;
    let exe = std::env::current_exe().ok()?;
    let meta = std::fs::metadata(&exe).ok()?;
    let mut h = blake3::Hasher::new();
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update(b"\0");
    h.update(exe.as_os_str().as_encoded_bytes());
    for n in [meta.len(), meta.mtime() as u64, meta.mtime_nsec() as u64, meta.ino(), meta.dev()] {
        h.update(&n.to_le_bytes());
    }
    Some(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        serde_json::json!({"name": "s", "nodes": {"a": {"op": "shell", "params": {"cmd": "true", "lr": 1e-3}}}})
    }

    #[test]
    fn a_saved_entry_reads_back_the_same_document_and_another_text_has_none() {
        let ws = tempfile::tempdir().unwrap();
        let cache = ParseCache::new(ws.path());
        assert_eq!(cache.get("name: s"), None, "nothing kept yet");
        cache.remember("name: s", &doc());
        assert_eq!(cache.get("name: s"), None, "kept only once saved");
        assert_eq!(cache.save().unwrap(), 1);
        assert_eq!(cache.save().unwrap(), 0, "each entry is written once");
        let again = ParseCache::new(ws.path());
        assert_eq!(again.get("name: s"), Some(doc()));
        assert_eq!(again.get("name: s "), None, "another text, another entry");
    }

    #[test]
    fn an_entry_cut_short_or_changed_is_not_read() {
        let ws = tempfile::tempdir().unwrap();
        let cache = ParseCache::new(ws.path());
        cache.remember("name: s", &doc());
        cache.save().unwrap();
        let entry = std::fs::read_dir(ws.path().join(FOLDER)).unwrap().next().unwrap().unwrap().path();
        let sound = std::fs::read(&entry).unwrap();
        // The same JSON with one value changed, and the whole file cut short.
        let changed = String::from_utf8(sound.clone()).unwrap().replace("true", "echo x");
        for bad in [changed.as_bytes(), &sound[..sound.len() - 1], &sound[..10], b""] {
            std::fs::write(&entry, bad).unwrap();
            assert_eq!(ParseCache::new(ws.path()).get("name: s"), None, "{}", String::from_utf8_lossy(bad));
        }
        std::fs::write(&entry, &sound).unwrap();
        assert_eq!(ParseCache::new(ws.path()).get("name: s"), Some(doc()), "the sound entry reads again");
    }

    #[test]
    fn no_link_is_read_through_or_written_through() {
        let ws = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        // A sound entry made elsewhere, reached through a linked folder and a linked file.
        let other = ParseCache::new(elsewhere.path());
        other.remember("name: s", &doc());
        other.save().unwrap();
        let made = std::fs::read_dir(elsewhere.path().join(FOLDER)).unwrap().next().unwrap().unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join(FOLDER), ws.path().join(FOLDER)).unwrap();
        let cache = ParseCache::new(ws.path());
        assert_eq!(cache.get("name: s"), None, "a linked folder is not read");
        cache.remember("name: t", &doc());
        let e = cache.save().unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(elsewhere.path().join(FOLDER)).unwrap().count(), 1, "nothing written there");
        std::fs::remove_file(ws.path().join(FOLDER)).unwrap();
        std::fs::create_dir(ws.path().join(FOLDER)).unwrap();
        std::os::unix::fs::symlink(made.path(), ws.path().join(FOLDER).join(made.file_name())).unwrap();
        assert_eq!(ParseCache::new(ws.path()).get("name: s"), None, "a linked entry is not read");
    }

    #[test]
    fn at_most_keep_entries_stay_and_nothing_else_is_removed() {
        let ws = tempfile::tempdir().unwrap();
        let dir = ws.path().join(FOLDER);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        for i in 0..KEEP + 3 {
            let cache = ParseCache::new(ws.path());
            cache.remember(&format!("name: s{i}"), &doc());
            cache.save().unwrap();
        }
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names.iter().filter(|n| is_entry_name(n)).count(), KEEP);
        assert!(names.iter().any(|n| n == "notes.txt"), "{names:?}");
        assert!(ParseCache::new(ws.path()).get(&format!("name: s{}", KEEP + 2)).is_some(), "the newest stays");
    }
}
