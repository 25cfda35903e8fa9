//! Node records: what `orchestrate reindex` rebuilds the index's cache rows
//! from, so the index is a view of the records and the objects, as git's
//! index is of its objects.
//!
//! Each process appends the records it commits, one JSON line each
//! ([`CachedNode`]), to a journal of its own, `records/<nanos>-<pid>.jsonl`,
//! made at its first commit. A record is written just before its cache row; a
//! record changed later (an output dropped) is appended again, and reindex
//! lets the checks decide between the two (an output whose object is gone is
//! left out, a dropped one is not looked for). `gc` rewrites each journal
//! without the records of the results it removes.
//!
//! Before, each record was a file of its own, `records/<kk>/<key>.json`: a
//! file and often a folder made per node (making them was a quarter of a small
//! node's own time on ext4). Those are still read by reindex and removed by gc.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::{fsx, io, CachedNode, Key, StoreError};

/// The largest record (or journal line) read.
pub(crate) const MAX_RECORD_BYTES: u64 = 64 << 20;

/// The largest journal read (reindex, gc).
const MAX_JOURNAL_BYTES: u64 = 4 << 30;

/// This process's journal, opened at its first record; shared by a
/// workspace's clones.
#[derive(Clone, Default)]
pub(crate) struct Journal(Arc<Mutex<Option<File>>>);

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Journal")
    }
}

fn is_journal(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".jsonl")
}

impl Journal {
    /// Appends `node`'s record to this process's journal in `records` (made,
    /// with the folder, at the first call; never through a link), synced
    /// unless a run defers its syncs. A write that fails leaves the journal
    /// to reindex as it is (a line cut short is left out there) and the next
    /// record starts a new one.
    pub(crate) fn append(&self, records: &Path, node: &CachedNode) -> Result<(), StoreError> {
        let mut line = serde_json::to_vec(node).expect("a cached node serializes");
        line.push(b'\n');
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            fsx::own_dir(records)?;
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            let path = records.join(format!("{nanos:020}-{}.jsonl", std::process::id()));
            // O_EXCL: a link planted at the name is an error, never written through.
            let file = OpenOptions::new()
                .append(true)
                .create_new(true)
                .open(&path)
                .map_err(io(format!("creating {}", path.display())))?;
            *slot = Some(file);
        }
        let file = slot.as_mut().expect("opened above");
        // Durable as a record file was: synced now, or with the whole run
        // when one defers its syncs (`objects::DeferredSync`).
        if let Err(e) = file.write_all(&line).and_then(|()| super::objects::sync_file(file)) {
            *slot = None;
            return Err(StoreError::Io {
                context: format!("writing a node record in {}", records.display()),
                source: e,
            });
        }
        Ok(())
    }

    /// Closes this process's journal: the next record starts a new one.
    pub(crate) fn close(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// The journals in `records`, sorted by name (the order their processes started).
pub(crate) fn journals(records: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut found = Vec::new();
    match fs::read_dir(records) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(io(format!("listing {}", records.display())))?;
                if is_journal(&entry.file_name().to_string_lossy()) {
                    found.push(entry.path());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::Io { context: format!("listing {}", records.display()), source: e }),
    }
    found.sort();
    Ok(found)
}

/// A journal's bytes: a regular file (no link followed, no FIFO waited on) of bounded size.
fn read_journal(path: &Path) -> Result<Vec<u8>, String> {
    use crate::fsread::{open_regular, read_opened, OpenedReadError};
    let file = open_regular(path, libc::O_NOFOLLOW).map_err(|e| e.to_string())?;
    read_opened(file, MAX_JOURNAL_BYTES).map_err(|e| match e {
        OpenedReadError::TooLarge(_) => format!("over the limit of {MAX_JOURNAL_BYTES} bytes"),
        OpenedReadError::Io(e) => e.to_string(),
    })
}

/// One line of a journal: its record, or why it is not one (a line cut
/// short by a process killed while writing it, an edit).
pub(crate) type Line = Result<CachedNode, String>;

/// Every record in a journal, in order, each named by its line number; a
/// journal that cannot be read at all is one `Err` line 0.
pub(crate) fn read(path: &Path) -> Vec<(usize, Line)> {
    let bytes = match read_journal(path) {
        Ok(bytes) => bytes,
        Err(why) => return vec![(0, Err(why))],
    };
    let mut out = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let record = if line.len() as u64 > MAX_RECORD_BYTES {
            Err(format!("{} bytes, over the limit of {MAX_RECORD_BYTES}", line.len()))
        } else {
            serde_json::from_slice::<CachedNode>(line).map_err(|e| format!("not a node record: {e}"))
        };
        out.push((n + 1, record));
    }
    out
}

/// The key a journal line names, read without the rest of the record.
fn line_key(line: &[u8]) -> Option<Key> {
    #[derive(serde::Deserialize)]
    struct Keyed {
        key: Key,
    }
    serde_json::from_slice::<Keyed>(line).ok().map(|k| k.key)
}

/// What rewriting the journals without some keys' records frees: bytes, and
/// each journal's new text (`None`: nothing of it is left).
type Rewrites = Vec<(PathBuf, Option<Vec<u8>>)>;

fn without(records: &Path, keys: &std::collections::BTreeSet<Key>) -> Result<(u64, Rewrites), StoreError> {
    let mut freed = 0u64;
    let mut rewrites = Vec::new();
    for path in journals(records)? {
        // A journal that cannot be read is left as it is (reindex says why).
        let Ok(bytes) = read_journal(&path) else { continue };
        let mut kept = Vec::with_capacity(bytes.len());
        for line in bytes.split_inclusive(|&b| b == b'\n') {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            if line_key(body).is_some_and(|k| keys.contains(&k)) {
                freed += line.len() as u64;
            } else {
                kept.extend_from_slice(line);
            }
        }
        if kept.len() != bytes.len() {
            rewrites.push((path, (!kept.iter().all(|b| b.is_ascii_whitespace())).then_some(kept)));
        }
    }
    Ok((freed, rewrites))
}

/// The bytes the records of `keys` take in the journals.
pub(crate) fn bytes_of(records: &Path, keys: &std::collections::BTreeSet<Key>) -> Result<u64, StoreError> {
    without(records, keys).map(|(freed, _)| freed)
}

/// Rewrites each journal without the records of `keys` (each whole or not
/// at all; one left empty is removed). Only for a process that holds the
/// workspace exclusively (gc), whose own journal `journal` is closed first.
pub(crate) fn forget(
    records: &Path,
    journal: &Journal,
    keys: &std::collections::BTreeSet<Key>,
) -> Result<(), StoreError> {
    journal.close();
    let (_, rewrites) = without(records, keys)?;
    for (path, kept) in rewrites {
        match kept {
            Some(bytes) => super::write_atomic(&path, &bytes).map_err(io(format!("writing {}", path.display())))?,
            None => fs::remove_file(&path).map_err(io(format!("removing {}", path.display())))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ObjectInfo, OutputKind, OutputRecord, Workspace};

    /// Node `n`'s record, keyed by its own hash inputs (as reindex checks).
    fn node(n: u8, object: &str, dropped: bool) -> CachedNode {
        let mut record = crate::record::HashInputs::empty_shell();
        record.files.insert(format!("f{n}"), "0".repeat(64));
        CachedNode {
            key: record.key(),
            node_id: format!("n{n}"),
            spec: "s".into(),
            record,
            outputs: vec![OutputRecord {
                name: "state".into(),
                object: ObjectInfo { hash: object.repeat(64), kind: OutputKind::File, size: 6, files: 1 },
                workspace_path: None,
                stat: None,
                dropped: dropped.then(|| "dropped by a test".to_string()),
            }],
            seconds: 1.0,
            finished_at: "now".into(),
            run_id: "r".into(),
            costs: None,
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// Each process (here, each opened workspace) appends to one journal of
    /// its own, and makes no file or folder per node; reindex reads every
    /// journal back, a line cut short is left out by its line, and a record
    /// file of an orchestrate before the journals is still read.
    #[test]
    fn records_are_lines_of_a_journal_per_process_and_reindex_reads_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let first = Workspace::open(dir.path()).unwrap();
        let index = first.index().unwrap();
        for n in 1..=3 {
            first.commit_node(&index, &node(n, "a", true)).unwrap();
        }
        let second = Workspace::open(dir.path()).unwrap();
        second.commit_node(&second.index().unwrap(), &node(4, "b", true)).unwrap();
        let records = dir.path().join("records");
        let names = entries(&records);
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| n.ends_with(".jsonl")), "{names:?}");
        // An orchestrate before the journals: one file per record, in a shard folder.
        let legacy = node(5, "c", true);
        fs::create_dir(records.join("05")).unwrap();
        fs::write(records.join("05").join(format!("{}.json", legacy.key)), serde_json::to_vec_pretty(&legacy).unwrap())
            .unwrap();
        // A process killed while writing its last line.
        let torn = records.join(&names[1]);
        OpenOptions::new().append(true).open(&torn).unwrap().write_all(b"{\"key\":\"0606").unwrap();

        let mut index = first.index().unwrap();
        let keys: Vec<Key> = (1..=5).map(|n| node(n, "a", true).key).collect();
        index.delete_nodes(&keys).unwrap();
        let done = first.reindex().unwrap();
        let mut added = done.added.clone();
        added.sort();
        assert_eq!(added, ["n1", "n2", "n3", "n4", "n5"]);
        assert_eq!(done.left_out.len(), 1, "{:?}", done.left_out);
        let (source, why) = &done.left_out[0];
        assert!(source.ends_with(&format!("{} line 2", names[1])), "{source}");
        assert!(why.starts_with("not a node record"), "{why}");
        assert_eq!(first.reindex().unwrap().present, 5);
    }

    /// An output dropped after its node was recorded is recorded again;
    /// reindex takes the latest record, and does not report the first one
    /// (whose object is gone) as left out.
    #[test]
    fn a_record_written_again_is_reindexed_from_its_latest_line() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let mut index = ws.index().unwrap();
        let kept = node(1, "d", false);
        ws.commit_node(&index, &kept).unwrap();
        assert!(ws.mark_dropped(&index, &kept.key, "state", "dropped by a test").unwrap().is_some());
        index.delete_nodes(std::slice::from_ref(&kept.key)).unwrap();
        let done = ws.reindex().unwrap();
        assert_eq!(done.added, ["n1"]);
        assert!(done.left_out.is_empty(), "{:?}", done.left_out);
        let back = ws.index().unwrap().lookup(&kept.key).unwrap().unwrap();
        assert_eq!(back.outputs[0].dropped.as_deref(), Some("dropped by a test"));
    }

    /// A record is synced as a record file was: here, under a run's
    /// deferred sync, the sync is left to the run's end (and counted there).
    #[test]
    fn a_record_is_synced_or_left_to_the_runs_deferred_sync() {
        use std::sync::atomic::Ordering;
        let _serial = crate::store::objects::DEFERRED_TESTS.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let index = ws.index().unwrap();
        let deferred = crate::store::objects::DeferredSync::start(dir.path());
        let before = crate::store::objects::SKIPPED.load(Ordering::SeqCst);
        ws.commit_node(&index, &node(1, "a", true)).unwrap();
        assert!(crate::store::objects::SKIPPED.load(Ordering::SeqCst) > before, "the record was never synced");
        deferred.finish().unwrap();
    }

    /// gc's part: each journal is rewritten without the records of the keys
    /// it removes, one left with none is removed, and this process's own
    /// journal is closed so its next record starts a new one.
    #[test]
    fn forgetting_keys_rewrites_each_journal_without_their_lines() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let index = ws.index().unwrap();
        for n in 1..=3 {
            ws.commit_node(&index, &node(n, "a", true)).unwrap();
        }
        let other = Workspace::open(dir.path()).unwrap();
        other.commit_node(&other.index().unwrap(), &node(4, "a", true)).unwrap();
        let records = dir.path().join("records");
        let key = |n| node(n, "a", true).key;
        let line_bytes = |n| serde_json::to_vec(&node(n, "a", true)).unwrap().len() as u64 + 1;
        let doomed: std::collections::BTreeSet<Key> = [key(2), key(4)].into();
        assert_eq!(ws.record_bytes(&doomed).unwrap(), line_bytes(2) + line_bytes(4));
        ws.forget_records(&doomed).unwrap();
        let left = journals(&records).unwrap();
        assert_eq!(left.len(), 1, "the journal left with no line is removed");
        let keys: Vec<Key> = read(&left[0]).into_iter().map(|(_, r)| r.unwrap().key).collect();
        assert_eq!(keys, [key(1), key(3)]);
        ws.commit_node(&index, &node(5, "a", true)).unwrap();
        assert_eq!(journals(&records).unwrap().len(), 2, "a record after gc starts a new journal");
    }
}
