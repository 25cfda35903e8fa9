//! `orchestrate gc` and `orchestrate du`: what the store holds, and removing
//! what no kept run needs, as `dvc gc` does.
//!
//! What is kept, for each kept spec: every node result of its `keep_runs`
//! latest runs (with the objects each run recorded having, where a later
//! `run --force` of a key stored other bytes in its row), and, for each node that the latest run did not finish (a run
//! of some targets only, a failure, an interrupt), that node's most recent
//! result, so gc never takes a node's last result away unless a newer one
//! replaced it; plus the keys and objects a pack given with `--keep-pack`
//! lists. Everything else (cache rows, their records and logs, the objects no
//! kept row or kept run names) is removed. Runs, their events and the stat cache stay.
//!
//! Cache rows go first (one transaction), then records, logs and objects: a
//! crash between leaves objects nobody names, which the next gc removes, and
//! never a row whose objects are gone. A run holds the workspace's use lock
//! (shared) for as long as it has the workspace open; gc takes it exclusively
//! and refuses while anyone holds it, so nothing in use is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::index::{CachedNode, NodeOutcome};
use super::{objects, Key, StoreError, Workspace};

/// What to keep.
#[derive(Debug, Clone, Default)]
pub struct KeepPolicy {
    /// The specs (by name) whose runs are kept; `None`: every spec's.
    pub specs: Option<BTreeSet<String>>,
    /// How many of each kept spec's latest runs are kept whole (at least 1).
    pub keep_runs: usize,
    /// Node keys kept whatever the runs say (a pack's nodes).
    pub keys: BTreeSet<Key>,
    /// Object hashes kept whatever the runs say (a pack's outputs).
    pub objects: BTreeSet<String>,
    /// Also drop the training states (outputs named `state`) of the kept
    /// results: their rows stay, marked, so what read them stays cached, and a
    /// run that needs a state again runs its node first (`--drop-states`).
    pub drop_states: bool,
    /// Also empty the trash (`--empty-trash`): the outs runs and checkouts
    /// moved aside hold the user's bytes, not the store's, so a plain gc,
    /// which frees the cache, keeps them.
    pub empty_trash: bool,
}

/// The output name of a training state (what `--drop-states` drops).
pub const STATE_OUTPUT: &str = "state";

/// One object in the store, as found on disk.
#[derive(Debug, Clone, Serialize)]
pub struct StoredObject {
    pub hash: String,
    /// Bytes of the file, or of every file of a folder object.
    pub bytes: u64,
    pub files: u64,
}

/// What gc would do, or did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcPlan {
    /// The runs whose results are kept.
    pub kept_runs: Vec<String>,
    pub kept_nodes: usize,
    pub kept_objects: usize,
    pub kept_bytes: u64,
    /// Cache rows removed: (spec, node id, key).
    pub removed_nodes: Vec<(String, String, Key)>,
    pub removed_objects: Vec<StoredObject>,
    /// Training states dropped from kept results: (spec, node id, key, bytes).
    pub dropped_states: Vec<(String, String, Key, u64)>,
    /// Logs and node records removed (their bytes are in `removed_other_bytes`).
    pub removed_files: usize,
    pub removed_other_bytes: u64,
    /// The trash ([`Workspace::trash_dir`]): outs that runs and checkouts
    /// moved aside rather than remove (the bytes the store lacked).
    pub trash_entries: usize,
    pub trash_bytes: u64,
    /// Whether gc empties the trash (whole), or keeps it
    /// ([`KeepPolicy::empty_trash`]).
    pub trash_emptied: bool,
}

impl GcPlan {
    pub fn removed_bytes(&self) -> u64 {
        self.removed_objects.iter().map(|o| o.bytes).sum::<u64>()
    }
}

/// Every object in the store, by hash.
pub fn stored_objects(ws: &Workspace) -> Result<BTreeMap<String, StoredObject>, StoreError> {
    let mut out = BTreeMap::new();
    let dir = ws.objects_dir();
    let Ok(shards) = std::fs::read_dir(&dir) else { return Ok(out) };
    for shard in shards {
        let shard = shard.map_err(io(&dir))?;
        let shard_path = shard.path();
        if !std::fs::symlink_metadata(&shard_path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        for entry in std::fs::read_dir(&shard_path).map_err(io(&shard_path))? {
            let entry = entry.map_err(io(&shard_path))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Only our own names: 64 hex digits (staging and foreign files are not objects).
            if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let (bytes, files) = size_of(&entry.path())?;
            out.insert(name.clone(), StoredObject { hash: name, bytes, files });
        }
    }
    Ok(out)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { context: format!("listing {}", path.display()), source }
}

/// Bytes and files under a path, links counted as themselves and never followed.
fn size_of(path: &Path) -> Result<(u64, u64), StoreError> {
    let meta = std::fs::symlink_metadata(path).map_err(io(path))?;
    if !meta.is_dir() {
        return Ok((meta.len(), 1));
    }
    let (mut bytes, mut files) = (0, 0);
    for entry in std::fs::read_dir(path).map_err(io(path))? {
        let (b, f) = size_of(&entry.map_err(io(path))?.path())?;
        bytes += b;
        files += f;
    }
    Ok((bytes, files))
}

/// What [`plan`] computes before removing anything.
struct Kept {
    runs: Vec<String>,
    keys: BTreeSet<Key>,
    /// The objects the kept runs had, as they recorded them: a run kept whole
    /// keeps its own bytes even where a later `run --force` of the same key
    /// stored others in the cache row.
    objects: BTreeSet<String>,
}

fn kept(ws: &Workspace, index: &super::Index, all: &[CachedNode], policy: &KeepPolicy) -> Result<Kept, StoreError> {
    let runs = index.recent_runs(usize::MAX >> 1)?;
    let mut per_spec: BTreeMap<&str, Vec<&super::RunRow>> = BTreeMap::new();
    for r in &runs {
        if policy.specs.as_ref().is_none_or(|s| s.contains(&r.spec)) {
            per_spec.entry(r.spec.as_str()).or_default().push(r);
        }
    }
    if let Some(specs) = &policy.specs {
        let known: BTreeSet<&str> = runs.iter().map(|r| r.spec.as_str()).collect();
        if let Some(missing) = specs.iter().find(|s| !known.contains(s.as_str())) {
            return Err(StoreError::Invalid(format!(
                "no run of spec '{missing}' in {}: gc keeps what a spec's latest run needs, and this one never ran here{}",
                ws.root().display(),
                crate::suggest::did_you_mean(missing, known.iter().copied())
            )));
        }
    }
    let mut keep = Kept { runs: Vec::new(), keys: policy.keys.clone(), objects: BTreeSet::new() };
    for (spec, spec_runs) in per_spec {
        // recent_runs is newest first.
        for (i, run) in spec_runs.iter().take(policy.keep_runs.max(1)).enumerate() {
            keep.runs.push(run.run_id.clone());
            let rows = index.run_nodes(&run.run_id)?;
            let mut finished = BTreeSet::new();
            for row in &rows {
                if let (Some(k), NodeOutcome::Ran | NodeOutcome::Cached) = (&row.key, row.outcome) {
                    keep.keys.insert(k.clone());
                    finished.insert(row.node_id.as_str());
                }
                let had = row.outputs.iter().flatten();
                let had = had.filter(|o| !(policy.drop_states && o.name == STATE_OUTPUT));
                keep.objects.extend(had.map(|o| o.object.hash.clone()));
            }
            if i == 0 {
                // The spec's nodes the latest run did not finish keep their most recent result.
                let mut latest: BTreeMap<&str, &CachedNode> = BTreeMap::new();
                for n in all.iter().filter(|n| n.spec == spec && !finished.contains(n.node_id.as_str())) {
                    let newer = latest.get(n.node_id.as_str()).is_none_or(|m| n.finished_at > m.finished_at);
                    if newer {
                        latest.insert(n.node_id.as_str(), n);
                    }
                }
                keep.keys.extend(latest.values().map(|n| n.key.clone()));
            }
        }
    }
    Ok(keep)
}

/// What gc would remove under `policy`, touching nothing.
pub fn plan(ws: &Workspace, policy: &KeepPolicy) -> Result<GcPlan, StoreError> {
    let index = ws.index()?;
    let all = index.all_nodes()?;
    let keep = kept(ws, &index, &all, policy)?;
    let stored = stored_objects(ws)?;
    let mut named: BTreeSet<String> = policy.objects.iter().chain(&keep.objects).cloned().collect();
    let mut result = GcPlan { kept_runs: keep.runs.clone(), ..GcPlan::default() };
    for n in &all {
        if keep.keys.contains(&n.key) {
            result.kept_nodes += 1;
            for o in n.outputs.iter().filter(|o| o.stored()) {
                let drop = policy.drop_states && o.name == STATE_OUTPUT && !policy.objects.contains(&o.object.hash);
                if drop {
                    result.dropped_states.push((n.spec.clone(), n.node_id.clone(), n.key.clone(), o.object.size));
                } else {
                    named.insert(o.object.hash.clone());
                }
            }
        } else {
            result.removed_nodes.push((n.spec.clone(), n.node_id.clone(), n.key.clone()));
        }
    }
    for (hash, o) in stored {
        if named.contains(&hash) {
            result.kept_objects += 1;
            result.kept_bytes += o.bytes;
        } else {
            result.removed_objects.push(o);
        }
    }
    for (_, _, key) in &result.removed_nodes {
        for path in node_files(ws, key) {
            if let Ok(m) = std::fs::symlink_metadata(&path) {
                result.removed_files += 1;
                result.removed_other_bytes += m.len();
            }
        }
    }
    if !result.removed_nodes.is_empty() {
        let keys: BTreeSet<Key> = result.removed_nodes.iter().map(|(_, _, k)| k.clone()).collect();
        result.removed_other_bytes += ws.record_bytes(&keys)?;
    }
    result.removed_objects.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.hash.cmp(&b.hash)));
    (result.trash_entries, result.trash_bytes) = trash_usage(ws)?;
    result.trash_emptied = policy.empty_trash && result.trash_entries > 0;
    Ok(result)
}

/// An error when a link lies on the way from the workspace root to `path`
/// (its folders or `path` itself): gc and `--drop-states` remove nothing
/// through one.
pub(crate) fn refuse_link(ws: &Workspace, path: &Path) -> Result<(), StoreError> {
    let rel = path.strip_prefix(ws.root()).map_err(|_| {
        StoreError::Invalid(format!("{} is outside the workspace {}", path.display(), ws.root().display()))
    })?;
    match super::fsx::link_on_path(ws.root(), &rel.to_string_lossy()) {
        Some(link) => Err(StoreError::Invalid(format!(
            "{} is a symbolic link: nothing is removed through it, and nothing was removed (remove the link and run again)",
            link.display()
        ))),
        None => Ok(()),
    }
}

/// A node's record file (from before the journals), log and `run --check`
/// log (the files besides its objects and its journal lines).
fn node_files(ws: &Workspace, key: &Key) -> [PathBuf; 3] {
    [ws.legacy_record_path(key), ws.log_path(key), ws.check_log_path(key)]
}

/// Removes what [`plan`] lists. `ws` must have been opened with
/// [`Workspace::open_exclusive`], so no other process is using it.
pub fn collect(ws: &Workspace, policy: &KeepPolicy) -> Result<GcPlan, StoreError> {
    if !ws.is_exclusive() {
        return Err(StoreError::Invalid("gc needs the workspace opened exclusively".into()));
    }
    let plan = plan(ws, policy)?;
    let keys: Vec<Key> = plan.removed_nodes.iter().map(|(_, _, k)| k.clone()).collect();
    // Nothing is removed through a link (a planted `records` → a user's
    // folder): every path gc would remove is checked before anything goes.
    let doomed = keys
        .iter()
        .flat_map(|k| {
            let [record, log, check_log] = node_files(ws, k);
            [record, log, check_log, Workspace::checkpoint_dir(ws.root(), k.as_str())]
        })
        .chain(plan.removed_objects.iter().map(|o| ws.object_path(&o.hash)))
        .chain((!keys.is_empty()).then(|| ws.records_dir()))
        .chain(plan.trash_emptied.then(|| ws.trash_dir()));
    for path in doomed {
        refuse_link(ws, &path)?;
    }
    let mut index = ws.index()?;
    index.delete_nodes(&keys)?;
    // Dropped states are marked in their rows and records before any object goes.
    let why = format!("dropped by gc --drop-states at {}", super::now_rfc3339());
    for (_, _, key, _) in &plan.dropped_states {
        ws.mark_dropped(&index, key, STATE_OUTPUT, &why)?;
    }
    ws.forget_records(&keys.iter().cloned().collect())?;
    for key in &keys {
        for path in node_files(ws, key) {
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                std::fs::remove_file(&path)
                    .map_err(|source| StoreError::Io { context: format!("removing {}", path.display()), source })?;
            }
        }
        let wal = Workspace::checkpoint_dir(ws.root(), key.as_str());
        if std::fs::symlink_metadata(&wal).is_ok_and(|m| m.is_dir()) {
            objects::remove_any(&wal)?;
        }
    }
    for o in &plan.removed_objects {
        objects::remove_any(&ws.object_path(&o.hash))?;
    }
    if plan.trash_emptied {
        objects::remove_any(&ws.trash_dir())?;
    }
    remove_legacy_locks(ws)?;
    Ok(plan)
}

/// Removes the lock files of an orchestrate before the node locks were bytes
/// of one file (`locks/<key>.lock`, one per key ever run; see
/// [`Workspace::lock_node`]): under gc's exclusive hold nothing holds them.
/// Only regular files named as those were; a linked `locks/` is left alone.
fn remove_legacy_locks(ws: &Workspace) -> Result<(), StoreError> {
    let locks = ws.root().join("locks");
    if !std::fs::symlink_metadata(&locks).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    let listing = |source| StoreError::Io { context: format!("listing {}", locks.display()), source };
    for entry in std::fs::read_dir(&locks).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let legacy = name.strip_suffix(".lock").is_some_and(|key| Key::parse(key).is_ok());
        if legacy && entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(entry.path())
                .map_err(|source| StoreError::Io { context: format!("removing {}", entry.path().display()), source })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gc removes the lock files an earlier orchestrate made per key, and
    /// nothing else in `locks/`.
    #[test]
    fn gc_removes_the_lock_files_of_earlier_versions_alone() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        drop(ws.lock_node(&"ab".repeat(32), || {}).unwrap());
        let locks = dir.path().join("locks");
        for name in ["cd".repeat(32) + ".lock", "ef".repeat(32) + ".lock"] {
            std::fs::write(locks.join(name), "").unwrap();
        }
        std::fs::write(locks.join("notes.txt"), "mine").unwrap();
        std::fs::write(locks.join("short.lock"), "").unwrap();
        std::fs::create_dir(locks.join(format!("{}.lock", "01".repeat(32)))).unwrap();
        drop(ws);
        let ws = Workspace::open_exclusive(dir.path()).unwrap();
        collect(&ws, &KeepPolicy { keep_runs: 1, ..KeepPolicy::default() }).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&locks)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [format!("{}.lock", "01".repeat(32)), "nodes.lock".into(), "notes.txt".into(), "short.lock".into()]
        );
    }
}

/// One line of `orchestrate du`: a node id of a spec, with every result of it the store holds.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub spec: String,
    pub node: String,
    pub keys: usize,
    pub objects: usize,
    /// Bytes of the objects these results name (an object two nodes share counts for each).
    pub bytes: u64,
}

/// The store's size by spec and node, largest first, and what no cache row names.
#[derive(Debug, Clone, Serialize)]
pub struct DiskUsage {
    pub nodes: Vec<Usage>,
    pub objects: usize,
    pub bytes: u64,
    /// Objects no cache row names (what `gc` removes whatever it keeps).
    pub unreferenced_objects: usize,
    pub unreferenced_bytes: u64,
    /// The trash: sets of outs moved aside, and their bytes (`gc` empties it).
    pub trash_entries: usize,
    pub trash_bytes: u64,
}

/// The trash's sets of outs and bytes (none where it is absent or a link).
fn trash_usage(ws: &Workspace) -> Result<(usize, u64), StoreError> {
    let trash = ws.trash_dir();
    if !std::fs::symlink_metadata(&trash).is_ok_and(|m| m.is_dir()) {
        return Ok((0, 0));
    }
    Ok((std::fs::read_dir(&trash).map_err(io(&trash))?.count(), size_of(&trash)?.0))
}

pub fn disk_usage(ws: &Workspace) -> Result<DiskUsage, StoreError> {
    let index = ws.index()?;
    let stored = stored_objects(ws)?;
    let mut by_node: BTreeMap<(String, String), (usize, BTreeSet<String>)> = BTreeMap::new();
    let mut named = BTreeSet::new();
    for n in index.all_nodes()? {
        let entry = by_node.entry((n.spec.clone(), n.node_id.clone())).or_default();
        entry.0 += 1;
        for o in &n.outputs {
            entry.1.insert(o.object.hash.clone());
            named.insert(o.object.hash.clone());
        }
    }
    let mut nodes: Vec<Usage> = by_node
        .into_iter()
        .map(|((spec, node), (keys, hashes))| {
            let present: Vec<&StoredObject> = hashes.iter().filter_map(|h| stored.get(h)).collect();
            Usage { spec, node, keys, objects: present.len(), bytes: present.iter().map(|o| o.bytes).sum() }
        })
        .collect();
    nodes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| (&a.spec, &a.node).cmp(&(&b.spec, &b.node))));
    let unreferenced: Vec<&StoredObject> = stored.values().filter(|o| !named.contains(&o.hash)).collect();
    let (trash_entries, trash_bytes) = trash_usage(ws)?;
    Ok(DiskUsage {
        trash_entries,
        trash_bytes,
        nodes,
        objects: stored.len(),
        bytes: stored.values().map(|o| o.bytes).sum(),
        unreferenced_objects: unreferenced.len(),
        unreferenced_bytes: unreferenced.iter().map(|o| o.bytes).sum(),
    })
}
