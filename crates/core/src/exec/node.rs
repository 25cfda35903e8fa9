//! Resolving one node: compute its key, decide once whether it is a cache hit
//! (and if not, why it runs: a typed [`DirtyReason`]), and hand a node that
//! must run to an [`Executor`] ([`Local`] here, Slurm in [`super::slurm`]).
//! Needs only the workspace, the compiled node and its upstream outputs, never
//! the scheduler, so a Slurm job running `orchestrate exec-node` calls it too.

use crate::store::Key;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::dag::key::{diff, EnvPart, HashInputs};
use crate::dag::DagNode;
use crate::ops::{InputArtifact, OutputKind, RunContext};
use crate::store::{
    now_rfc3339, CachedNode, FileStat, Index, OutputProblem, OutputRecord, Replace, SpecRef, StoreError, Workspace,
};

/// The result of resolving one node.
#[derive(Debug, Clone)]
pub enum Outcome {
    Cached {
        key: Key,
        outputs: Vec<OutputRecord>,
        /// The remote it was fetched from (`None`: the local cache).
        remote: Option<String>,
        /// Its outputs in the user's tree were missing or differed and were
        /// checked out of the store: what was restored (`2 files, 16 B`).
        restored: Option<String>,
        /// Outs so replaced whose bytes the store lacked, moved into the trash.
        moved: Vec<crate::store::MovedOut>,
    },
    Ran {
        key: Key,
        outputs: Vec<OutputRecord>,
        seconds: f64,
        /// Where it ran when not under this process, e.g. `Slurm job 123 on gpu017`.
        job: Option<String>,
        /// A training op's headline figures, as its worker reported them.
        summary: Option<crate::train::metrics::TrainingSummary>,
    },
    Failed {
        key: Option<Key>,
        error: String,
        seconds: f64,
    },
    /// Not run: a node it depends on failed.
    Skipped {
        because: String,
    },
}

/// Everything one node resolution needs.
pub struct NodeJob<'a> {
    pub ws: &'a Workspace,
    pub index: &'a Index,
    pub node: &'a DagNode,
    pub spec_name: &'a str,
    /// The spec's profile (`None`: none), with its name what "why" compares against.
    pub spec_profile: Option<&'a str>,
    pub spec_dir: &'a Path,
    pub run_id: &'a str,
    /// Outputs of the nodes this one reads, by node id.
    pub upstream: &'a BTreeMap<String, Vec<OutputRecord>>,
    pub env: Option<EnvPart>,
    pub force: bool,
    pub cancel: &'a AtomicBool,
    /// The run's CPU slots, shared by its numerical nodes on the CPU (`None`
    /// where nodes run elsewhere, as Slurm jobs).
    pub cpu: Option<&'a CpuSlots>,
    /// The shared remote cache consulted on a local miss (`run --remote`).
    pub remote: Option<&'a crate::remote::Remote>,
}

/// The machine's cores, shared by the numerical nodes running on its CPU: each
/// holds as many as its libtorch threads (see [`crate::runtime::worker_threads`]
/// and a node's `threads`) while it runs, whatever `--jobs` allows, as
/// Snakemake's `--cores` bounds the sum of its rules' `threads`.
///
/// Across processes: a core is a lock file (`slot-N`) in a folder every
/// orchestrate process of this user on this machine shares
/// ([`crate::store::fsx::machine_dir`]), held with `flock` while the node runs, so two runs
/// side by side never put more numerical nodes on the CPU than it has cores;
/// the kernel releases a killed process's locks. Where that folder cannot be
/// used, the slots are this process's own (said once on stderr).
pub struct CpuSlots {
    /// The machine-wide slot files' folder (`None`: this process only).
    dir: Option<PathBuf>,
    used: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Default for CpuSlots {
    /// This process's own slots (tests; a folder that cannot be used).
    fn default() -> Self {
        CpuSlots { dir: None, used: Default::default(), freed: Default::default() }
    }
}

/// How long a node waits before it asks the machine's slots again.
const SLOT_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Cores held while a numerical node runs.
pub struct CpuSlot<'a> {
    slots: &'a CpuSlots,
    /// Cores counted in this process (the process-local slots).
    local: usize,
    /// The slot files locked (the machine's slots): unlocked when closed.
    _files: Vec<std::fs::File>,
}

impl CpuSlots {
    /// The slots every orchestrate process of this user on this machine shares.
    /// Where the machine's folder cannot be used, they are this run's own
    /// ([`crate::store::fsx::machine_dir`] says so once).
    pub fn machine() -> CpuSlots {
        match crate::store::fsx::machine_dir() {
            Some(dir) => CpuSlots::in_dir(dir.to_path_buf()),
            None => CpuSlots::default(),
        }
    }

    /// Slots shared through the lock files in `dir`.
    pub fn in_dir(dir: PathBuf) -> CpuSlots {
        CpuSlots { dir: Some(dir), ..Default::default() }
    }

    /// Waits until `threads` of `cores` are free (a node asking for more than
    /// the machine has runs alone), and holds them.
    pub fn acquire(&self, threads: usize, cores: usize) -> CpuSlot<'_> {
        self.acquire_until(threads, cores, &|| false).expect("a wait nothing stops ends with the slots")
    }

    /// [`CpuSlots::acquire`], whose wait `stop` ends (a run's Ctrl-C): `None`
    /// then. Free slots are taken at once, whatever `stop` says.
    pub fn acquire_until(&self, threads: usize, cores: usize, stop: &dyn Fn() -> bool) -> Option<CpuSlot<'_>> {
        let want = threads.clamp(1, cores.max(1));
        if let Some(dir) = &self.dir {
            match self.lock_files(dir, want, cores.max(1), stop) {
                Ok(Some(files)) => return Some(CpuSlot { slots: self, local: 0, _files: files }),
                Ok(None) => return None,
                Err(e) => eprintln!(
                    "note: the machine's CPU slots in {} cannot be used ({e}); this node counts this run's only",
                    dir.display()
                ),
            }
        }
        let mut used = self.used.lock().expect("cpu slots");
        while *used + want > cores.max(1) {
            if stop() {
                return None;
            }
            used = self.freed.wait_timeout(used, SLOT_POLL).expect("cpu slots").0;
        }
        *used += want;
        Some(CpuSlot { slots: self, local: want, _files: Vec::new() })
    }

    /// Locks `want` of the `cores` slot files, all or none at a time (a node
    /// never sits on part of what it needs while another waits for the rest);
    /// `None` when `stop` ends the wait.
    fn lock_files(
        &self,
        dir: &Path,
        want: usize,
        cores: usize,
        stop: &dyn Fn() -> bool,
    ) -> std::io::Result<Option<Vec<std::fs::File>>> {
        // Opened once: a node that waits asks the same files again.
        let files = (0..cores)
            .map(|n| crate::store::fsx::open_lock(&dir.join(format!("slot-{n}"))))
            .collect::<std::io::Result<Vec<_>>>()?;
        loop {
            let mut held = Vec::with_capacity(want);
            for (n, file) in files.iter().enumerate() {
                match file.try_lock() {
                    Ok(()) => held.push(n),
                    Err(std::fs::TryLockError::WouldBlock) => {}
                    Err(std::fs::TryLockError::Error(e)) => return Err(e),
                }
                if held.len() == want {
                    // The files not held close unlocked; the held ones stay locked until the slot drops.
                    return Ok(Some(
                        files.into_iter().enumerate().filter(|(n, _)| held.contains(n)).map(|(_, f)| f).collect(),
                    ));
                }
            }
            for &n in &held {
                let _ = files[n].unlock();
            }
            if stop() {
                return Ok(None);
            }
            std::thread::sleep(SLOT_POLL);
        }
    }
}

impl Drop for CpuSlot<'_> {
    fn drop(&mut self) {
        if self.local > 0 {
            *self.slots.used.lock().expect("cpu slots") -= self.local;
            self.slots.freed.notify_all();
        }
    }
}

impl NodeJob<'_> {
    /// This node's hash-input record (its key is `record.key()`).
    pub fn record(&self) -> Result<HashInputs, RecordError> {
        hash_inputs(self.ws, self.index, self.node, self.spec_dir, self.upstream, self.env.clone())
    }
}

/// The upstream output an input reference names, if it was produced.
fn upstream_output<'a>(
    upstream: &'a BTreeMap<String, Vec<OutputRecord>>,
    r: &crate::spec::OutputRef,
) -> Option<&'a OutputRecord> {
    upstream.get(&r.node)?.iter().find(|o| o.name == r.output)
}

/// Why a node's hash-input record could not be computed (the node fails with
/// it, naming the input, dep, params file or interpreter).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("input '{input}': output {output} is not available")]
    InputUnavailable { input: String, output: String },
    #[error("dep '{dep}' does not exist ({}) and no node writes it", .path.display())]
    DepMissing { dep: String, path: PathBuf },
    #[error("dep '{dep}' is no longer a folder ({})", .path.display())]
    DepNotAFolder { dep: String, path: PathBuf },
    #[error("dep '{dep}': '{file}' matched when the spec was read and is no longer a file")]
    GlobGone { dep: String, file: String },
    #[error("dep '{dep}': {source}")]
    Dep {
        dep: String,
        #[source]
        source: crate::dag::deps::DepsError,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("params file {0}")]
    ParamsFile(#[source] Box<crate::docfile::DocError>),
    #[error("params file '{file}' has no key '{key}' ({}): {source}", .path.display())]
    ParamsKey {
        file: String,
        key: String,
        path: PathBuf,
        #[source]
        source: Box<crate::docfile::DocError>,
    },
    #[error(transparent)]
    Interpreter(#[from] crate::reward::RewardError),
    /// A file the node reads holds the same bytes as data its role may not
    /// read (a copy of the test file, of stored test labels).
    #[error("{why}: {dep} holds the same bytes as {data} ({taint}), so it is that data")]
    CopiedData { why: &'static str, dep: String, data: String, taint: crate::ops::Taint },
}

/// Builds the hash-input record of a node from its upstream outputs and files.
pub fn hash_inputs(
    ws: &Workspace,
    index: &Index,
    node: &DagNode,
    spec_dir: &Path,
    upstream: &BTreeMap<String, Vec<OutputRecord>>,
    env: Option<EnvPart>,
) -> Result<HashInputs, RecordError> {
    let mut inputs = BTreeMap::new();
    for (name, refs) in &node.inputs {
        let mut hashes = Vec::with_capacity(refs.len());
        for r in refs {
            let out = upstream_output(upstream, r)
                .ok_or_else(|| RecordError::InputUnavailable { input: name.clone(), output: r.to_string() })?;
            hashes.push(out.object.hash.clone());
        }
        inputs.insert(name.clone(), hashes);
    }
    let mut files = BTreeMap::new();
    for f in &node.files {
        let path = spec_dir.join(f);
        if !path.is_file() {
            return Err(RecordError::DepMissing { dep: f.clone(), path });
        }
        let h = ws.hash_user_file(index, &path)?;
        files.insert(f.clone(), h);
    }
    let mut trees = BTreeMap::new();
    for t in &node.trees {
        let mut hashes = BTreeMap::new();
        match &t.kind {
            crate::dag::deps::TreeKind::Dir { .. } => {
                let dir = spec_dir.join(&t.name);
                if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                    return Err(RecordError::DepNotAFolder { dep: t.name.clone(), path: dir });
                }
                let listed = crate::dag::deps::walk(spec_dir, &t.name, None)
                    .map_err(|source| RecordError::Dep { dep: t.name.clone(), source })?;
                for rel in listed {
                    if t.skips(&rel) {
                        continue;
                    }
                    let h = ws.hash_user_file(index, &spec_dir.join(&rel))?;
                    let inside = rel.strip_prefix(&format!("{}/", t.name)).unwrap_or(&rel).to_string();
                    hashes.insert(inside, h);
                }
            }
            crate::dag::deps::TreeKind::Glob { matches } => {
                for rel in matches {
                    let path = spec_dir.join(rel);
                    if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                        return Err(RecordError::GlobGone { dep: t.name.clone(), file: rel.clone() });
                    }
                    hashes.insert(rel.clone(), ws.hash_user_file(index, &path)?);
                }
            }
        }
        trees.insert(t.name.clone(), hashes);
    }
    let mut params_files = BTreeMap::new();
    for (file, keys) in &node.params_files {
        let doc = crate::docfile::read(spec_dir, file).map_err(|e| RecordError::ParamsFile(Box::new(e)))?;
        let mut values = BTreeMap::new();
        for k in keys {
            let v = crate::docfile::lookup(&doc, k).map_err(|source| RecordError::ParamsKey {
                file: file.clone(),
                key: k.clone(),
                path: spec_dir.join(file),
                source: Box::new(source),
            })?;
            crate::docfile::exact_param(file, k, v).map_err(|e| RecordError::ParamsFile(Box::new(e)))?;
            values.insert(k.clone(), v.clone());
        }
        params_files.insert(file.clone(), values);
    }
    let mut interpreters = BTreeMap::new();
    for i in node.op.interpreters(&node.params) {
        let version = crate::reward::interpreter_version(&i)?;
        interpreters.insert(i, version);
    }
    copied_data(ws, index, node, spec_dir, &files, &trees)?;
    Ok(HashInputs {
        op: node.op.name().to_string(),
        op_version: node.op.version(),
        params: node.params.value().clone(),
        inputs,
        files,
        trees,
        params_files,
        interpreters,
        env: if node.op.numerical() { env } else { None },
    })
}

/// Guarded data smaller than this is not compared: `{}` or `[]` says too
/// little to be a copy of anything, and files like it are everywhere.
const COPY_MIN_BYTES: u64 = 64;

/// Refuses a node whose role forbids some data ([`crate::dag::Guarded`])
/// when a file it reads (`files`, and each file of `trees`) has the same
/// bytes as that data under another path: a copy of the raw test file an
/// import reads, or of a stored output carrying test labels. The compile-time
/// check goes by path, and cannot see a copy. Nothing is hashed for a node
/// that reads no file of the user's or may read everything.
fn copied_data(
    ws: &Workspace,
    index: &Index,
    node: &DagNode,
    spec_dir: &Path,
    files: &BTreeMap<String, String>,
    trees: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<(), RecordError> {
    if node.guarded.is_empty() || (files.is_empty() && trees.values().all(BTreeMap::is_empty)) {
        return Ok(());
    }
    let role = node.op.role(&node.params);
    let forbidden: Vec<(&crate::dag::Guarded, crate::ops::Taint, &'static str)> = node
        .guarded
        .iter()
        .filter_map(|g| g.forbidden_to(node.id(), role).map(|(taint, why)| (g, taint, why)))
        .collect();
    if forbidden.is_empty() {
        return Ok(());
    }
    let mut read: BTreeMap<&str, String> = BTreeMap::new();
    for (rel, hash) in files {
        read.entry(hash.as_str()).or_insert_with(|| format!("dep '{rel}'"));
    }
    for t in &node.trees {
        for (rel, hash) in trees.get(&t.name).into_iter().flatten() {
            read.entry(hash.as_str()).or_insert_with(|| format!("dep '{}' ('{}')", t.name, t.file(rel)));
        }
    }
    for (g, taint, why) in forbidden {
        let hashes: Vec<String> = match &g.data {
            crate::dag::GuardedData::File { path, .. } => {
                let full = spec_dir.join(path);
                match std::fs::symlink_metadata(&full) {
                    Ok(m) if m.is_file() && m.len() >= COPY_MIN_BYTES => vec![ws.hash_user_file(index, &full)?],
                    _ => Vec::new(),
                }
            }
            crate::dag::GuardedData::Output { spec, node: producer, output } => index
                .outputs_of_node(spec, producer)?
                .into_iter()
                .filter(|o| {
                    o.name == *output
                        && o.object.kind == crate::store::OutputKind::File
                        && o.object.size >= COPY_MIN_BYTES
                })
                .map(|o| o.object.hash)
                .collect(),
        };
        if let Some(dep) = hashes.iter().find_map(|h| read.get(h.as_str())) {
            return Err(RecordError::CopiedData { why, dep: dep.clone(), data: g.data.to_string(), taint });
        }
    }
    Ok(())
}

/// Why a node runs instead of being a cache hit, as Cargo's dirty reasons say
/// why a unit rebuilds. Computed once, from the index; shown by `plan`, `run`
/// and the Slurm executor through `Display`.
#[derive(Debug, Clone, PartialEq)]
pub enum DirtyReason {
    /// `--force` named it.
    Forced,
    /// No completed record of this node id, and no failed attempt of this key.
    New,
    /// This exact key failed in an earlier run (nothing changed since).
    FailedIn { run_id: String, error: String },
    /// The fields of the hash-input record that changed since the node's last completed record.
    Changed(Vec<crate::dag::key::Change>),
    /// The record is the same, but its outputs are missing or were modified.
    OutputsMissing,
    /// The key has a cache entry whose outputs no longer check out (what the store found).
    OutputsInvalid(String),
}

impl std::fmt::Display for DirtyReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirtyReason::Forced => write!(f, "forced"),
            DirtyReason::New => write!(f, "new node"),
            DirtyReason::FailedIn { run_id, error } => {
                let first = error.lines().next().unwrap_or_default();
                let short: String = first.chars().take(120).collect();
                let more = if short.len() < error.len() { "…" } else { "" };
                write!(f, "failed in run {run_id}: {short}{more}")
            }
            DirtyReason::Changed(changes) => write!(f, "{}", crate::dag::key::describe(changes)),
            DirtyReason::OutputsMissing => write!(f, "outputs missing or modified"),
            DirtyReason::OutputsInvalid(why) => write!(f, "{why}"),
        }
    }
}

/// Says why a node whose key has no cache row runs: the key's last failure, or
/// what changed since the node's last completed record. (A key with a row is a
/// hit or `OutputsInvalid`: one that completed since it failed is not "failed".)
fn why_absent(
    index: &Index,
    spec: SpecRef<'_>,
    node_id: &str,
    key: &str,
    record: &HashInputs,
) -> Result<DirtyReason, StoreError> {
    if let Some((run_id, error)) = index.last_failure(node_id, key)? {
        return Ok(DirtyReason::FailedIn { run_id, error });
    }
    let Some(last) = index.latest_for_node(node_id, spec)? else {
        return Ok(DirtyReason::New);
    };
    let changes = diff(&last.record, record);
    Ok(if changes.is_empty() { DirtyReason::OutputsMissing } else { DirtyReason::Changed(changes) })
}

/// A node's cache decision, made once from the index: by the scheduler before
/// any executor sees the node, by `plan`, and by a Slurm job for its node.
#[derive(Debug, Clone)]
pub enum Decision {
    /// A valid cache entry; these are its outputs.
    Hit(Vec<OutputRecord>),
    /// A cache entry whose objects are all in the store, but whose outputs in
    /// the user's tree are missing or differ (why): they are checked out of
    /// the store instead of the node running.
    Restore(Box<CachedNode>, String),
    /// The node must run, and why.
    Run(DirtyReason),
}

/// Decides whether the node with this record (and key) is a cache hit, and if
/// not, why it runs.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    ws: &Workspace,
    index: &Index,
    spec_dir: &Path,
    spec: SpecRef<'_>,
    node_id: &str,
    record: &HashInputs,
    key: &str,
    force: bool,
) -> Result<Decision, StoreError> {
    if force {
        return Ok(Decision::Run(DirtyReason::Forced));
    }
    Ok(match cached_valid(ws, index, spec_dir, key)? {
        Ok(outputs) => Decision::Hit(outputs),
        Err(Some(problem)) => match index.lookup(key)? {
            Some(cached) if ws.objects_present(&cached) => Decision::Restore(Box::new(cached), problem.to_string()),
            _ => Decision::Run(DirtyReason::OutputsInvalid(problem.to_string())),
        },
        Err(None) => Decision::Run(why_absent(index, spec, node_id, key, record)?),
    })
}

impl NodeJob<'_> {
    /// On a local miss, the node from the shared remote cache (`run
    /// --remote`): `Ok(None)` when there is no remote, the node is forced, or
    /// the remote lacks it; `Err` says why a copy it has was not taken
    /// (refused, unreachable), and the node then runs here.
    pub fn from_remote(&self, key: &Key) -> Result<Option<Outcome>, NotTaken> {
        let (false, Some(remote)) = (self.force, self.remote) else { return Ok(None) };
        let quiet = crate::remote::sync_progress_none();
        let local = crate::remote::LocalNode { id: self.node.id(), spec: self.spec_name, outputs: &self.node.outputs };
        match crate::remote::fetch_node(self.ws, self.index, remote, key, local, self.spec_dir, &quiet) {
            Ok(Some((node, verified))) => Ok(Some(Outcome::Cached {
                key: key.clone(),
                outputs: node.outputs,
                remote: Some(match remote.trust.flagged(&verified) {
                    Some(why) => format!("{} (unverified: {why}; taken by --trust-unsigned)", remote.url),
                    None => remote.url.to_string(),
                }),
                restored: None,
                moved: Vec::new(),
            })),
            Ok(None) => Ok(None),
            Err(source) => Err(NotTaken { url: remote.url.to_string(), source }),
        }
    }
}

/// Why a copy the remote cache has was not taken (the node then runs here).
#[derive(Debug, thiserror::Error)]
#[error("not taken from {url}: {source}")]
pub struct NotTaken {
    pub url: String,
    #[source]
    pub source: crate::remote::RemoteError,
}

/// What the caller hears about while a node resolves.
pub trait NodeObserver {
    fn started(&mut self, key: &Key, reason: &str);
    fn waiting(&mut self, key: &Key, reason: &str);
}

/// The most file-dep bytes a node may have for the scheduler's thread to key
/// it ([`early`]): hashing more, when they changed, would hold up the others.
const EARLY_FILE_BYTES: u64 = 16 << 20;

/// What the scheduler's thread learnt of a ready node before handing it to a
/// job thread ([`early`]).
pub enum Early {
    /// Decided here: cached, and its outputs are valid (nothing to run, lock
    /// or wait for); or failed, our own code having panicked while keying it.
    Done(Outcome),
    /// Not a plain hit: what was decided, so nothing is computed twice
    /// (checking the cache has effects: an object found corrupt is set aside,
    /// and a second check would give another reason).
    Decided(Box<Decided>),
    /// Left whole to [`resolve`] (a numerical or forced node, or its record
    /// did not compute: `resolve` reports why).
    Unknown,
}

/// A node's record, its key and the cache's decision on it, made once.
pub struct Decided {
    pub record: HashInputs,
    pub key: Key,
    pub decision: Decision,
}

/// Decides a ready node in the scheduler's own thread when it is a plain
/// cache hit, with no lock, thread hand-off or wait: a hit takes no node lock
/// in [`resolve`] either, so the outcome is the same. Everything else goes to
/// a job thread as before.
pub fn early(job: &NodeJob<'_>) -> Early {
    let node = job.node;
    if job.force || job.env.is_some() || node.op.numerical() {
        return Early::Unknown;
    }
    // Only what is quick to key: a folder or glob dep, a program's interpreter
    // (a process to ask) or large files to hash would hold up the scheduler,
    // so those nodes are keyed in a job thread, beside the others, as before.
    if !node.trees.is_empty() || !node.op.interpreters(&node.params).is_empty() {
        return Early::Unknown;
    }
    let bytes: u64 = node
        .files
        .iter()
        .map(|f| std::fs::symlink_metadata(job.spec_dir.join(f)).map_or(u64::MAX, |m| m.len()))
        .fold(0, u64::saturating_add);
    if bytes > EARLY_FILE_BYTES {
        return Early::Unknown;
    }
    let Ok(record) = job.record() else { return Early::Unknown };
    let key = record.key();
    let spec = SpecRef { name: job.spec_name, profile: job.spec_profile };
    match decide(job.ws, job.index, job.spec_dir, spec, job.node.id(), &record, &key, job.force) {
        Ok(Decision::Hit(outputs)) => {
            Early::Done(Outcome::Cached { key, outputs, remote: None, restored: None, moved: Vec::new() })
        }
        Ok(decision) => Early::Decided(Box::new(Decided { record, key, decision })),
        // An error is for `resolve` to report, as it would have.
        Err(_) => Early::Unknown,
    }
}

/// Resolves one node: the scheduler's decision (cache hit, or why it runs;
/// given when [`early`] made it), then, if it runs, the executor's.
pub fn resolve(
    job: &NodeJob<'_>,
    executor: &dyn Executor,
    observer: &mut dyn NodeObserver,
    decided: Option<Box<Decided>>,
) -> Outcome {
    let started = Instant::now();
    let failed =
        |key: Option<Key>, error: String| Outcome::Failed { key, error, seconds: started.elapsed().as_secs_f64() };
    let (record, key, decision) = match decided.map(|d| *d) {
        Some(Decided { record, key, decision }) => (record, key, Ok(decision)),
        None => {
            let record = match job.record() {
                Ok(r) => r,
                Err(e) => return failed(None, e.to_string()),
            };
            let key = record.key();
            let spec = SpecRef { name: job.spec_name, profile: job.spec_profile };
            let decision = decide(job.ws, job.index, job.spec_dir, spec, job.node.id(), &record, &key, job.force);
            (record, key, decision)
        }
    };
    match decision {
        Ok(Decision::Hit(outputs)) => Outcome::Cached { key, outputs, remote: None, restored: None, moved: Vec::new() },
        Ok(Decision::Restore(cached, why)) => match restore(job, &cached) {
            Ok(outcome) => outcome,
            Err(e) => {
                let reason = DirtyReason::OutputsInvalid(format!("{why}; checking it out of the store failed: {e}"));
                executor.execute(job, &ToRun { record: &record, key: &key, reason: &reason, started }, observer)
            }
        },
        Ok(Decision::Run(reason)) => {
            executor.execute(job, &ToRun { record: &record, key: &key, reason: &reason, started }, observer)
        }
        Err(e) => failed(Some(key), e.to_string()),
    }
}

/// Checks a cached node's outputs out of the store, under its node lock (a
/// process running the same key is waited for).
fn restore(job: &NodeJob<'_>, cached: &CachedNode) -> Result<Outcome, String> {
    let _lock = job.lock_key(&cached.key, || {}).map_err(|e| e.to_string())?;
    let _outs = job.lock_outs(|_| {}).map_err(|e| e.to_string())?;
    let r = job.ws.restore_outputs(job.index, cached, job.spec_dir, Replace::All).map_err(|e| e.to_string())?;
    Ok(Outcome::Cached {
        key: cached.key.clone(),
        outputs: r.outputs,
        remote: None,
        restored: Some(files_and_bytes(r.files, r.bytes)),
        moved: r.moved,
    })
}

/// A node the scheduler decided to run, as an executor receives it.
pub struct ToRun<'a> {
    pub record: &'a HashInputs,
    pub key: &'a Key,
    pub reason: &'a DirtyReason,
    /// When its resolution began (its key was computed after it).
    pub started: Instant,
}

impl ToRun<'_> {
    /// A failure of this node, timed from the start of its resolution.
    pub fn failed(&self, error: String) -> Outcome {
        Outcome::Failed { key: Some(self.key.clone()), error, seconds: self.started.elapsed().as_secs_f64() }
    }

    /// A lock this node waited for, or its outcome without it: skipped when
    /// the run was interrupted during the wait, failed on any other error.
    fn held<T>(&self, lock: Result<T, StoreError>) -> Result<T, Box<Outcome>> {
        lock.map_err(|e| {
            Box::new(match e {
                StoreError::Interrupted { .. } => Outcome::Skipped { because: e.to_string() },
                e => self.failed(e.to_string()),
            })
        })
    }
}

/// Where a node runs once the scheduler has decided it must: under its key,
/// publishing through the store, or failing. Executors decide nothing about
/// the cache; they only re-check it after waiting for someone else (a node
/// lock, a Slurm job another run submitted).
pub trait Executor: Sync {
    fn execute(&self, job: &NodeJob<'_>, run: &ToRun<'_>, observer: &mut dyn NodeObserver) -> Outcome;
}

/// Runs nodes in this process (their ops may start child processes), one
/// node lock per key so concurrent `orchestrate` processes never run a key twice.
pub struct Local;

impl Executor for Local {
    fn execute(&self, job: &NodeJob<'_>, run: &ToRun<'_>, observer: &mut dyn NodeObserver) -> Outcome {
        let key = run.key;
        let lock = job.lock_key(key, || {
            observer.waiting(
                key,
                &format!("another orchestrate process is running node '{}' (key {})", job.node.id(), key.short()),
            )
        });
        let _lock = match run.held(lock) {
            Ok(l) => l,
            Err(outcome) => return *outcome,
        };
        if !job.force {
            // The process we waited for may have completed it.
            if let Ok(Ok(outputs)) = job.cached_valid(key) {
                return Outcome::Cached { key: key.clone(), outputs, remote: None, restored: None, moved: Vec::new() };
            }
        }
        // A local miss: the shared remote cache may have it (`run --remote`).
        let mut reason = run.reason.to_string();
        match job.from_remote(key) {
            Ok(Some(cached)) => return cached,
            Ok(None) => {}
            // Refused or unreachable: said in the reason, and it runs here.
            Err(why) => reason = format!("{reason}; {why}"),
        }
        // Its outs in the tree, which a run of another key may be writing (after
        // the remote, whose checkout takes them itself).
        let outs = job.lock_outs(|out| {
            observer.waiting(
                key,
                &format!(
                    "another orchestrate process is writing the out '{out}' (node '{}' with another key)",
                    job.node.id()
                ),
            )
        });
        let _outs = match run.held(outs) {
            Ok(l) => l,
            Err(outcome) => return *outcome,
        };
        let _slot = match (&job.env, job.cpu) {
            (Some(env), Some(slots)) if env.device == "cpu" => {
                match slots.acquire_until(env.threads.unwrap_or(1), crate::runtime::cores(), &|| job.stopped()) {
                    Some(slot) => Some(slot),
                    None => {
                        let because = "interrupted while waiting for a CPU slot (other nodes held every core)";
                        return Outcome::Skipped { because: because.to_string() };
                    }
                }
            }
            _ => None,
        };
        // What stands at its outs and the store lacks is moved aside, never
        // removed (the op removes its outs before it runs).
        match set_aside_unstored_outs(job) {
            Ok(moved) => moved.iter().for_each(|m| reason.push_str(&format!("; {m}"))),
            Err(e) => return run.failed(e.to_string()),
        }
        observer.started(key, &reason);
        match run_and_publish(job, run.record, key) {
            Ok((outputs, summary)) => Outcome::Ran {
                key: key.clone(),
                outputs,
                seconds: run.started.elapsed().as_secs_f64(),
                job: None,
                summary,
            },
            Err(e) => run.failed(e),
        }
    }
}

/// Moves into the workspace's trash each of the node's outs in the tree
/// whose bytes the store lacks ([`Workspace::set_aside_unstored`]), checked
/// against the node's latest record of its outs. Called under the outs' lock.
fn set_aside_unstored_outs(job: &NodeJob<'_>) -> Result<Vec<crate::store::MovedOut>, StoreError> {
    let there: Vec<&String> =
        job.node.tree_outs().filter(|rel| std::fs::symlink_metadata(job.spec_dir.join(rel)).is_ok()).collect();
    if there.is_empty() {
        return Ok(Vec::new());
    }
    let spec = SpecRef { name: job.spec_name, profile: job.spec_profile };
    let last = job.index.latest_for_node(job.node.id(), spec)?;
    let mut moved = Vec::new();
    for rel in there {
        let recorded = last.as_ref().and_then(|n| n.outputs.iter().find(|o| o.workspace_path.as_ref() == Some(rel)));
        moved.extend(job.ws.set_aside_unstored(job.index, job.spec_dir, rel, recorded)?);
    }
    Ok(moved)
}

/// `Ok(Ok(outputs))` on a valid hit, `Ok(Err(Some(problem)))` if cached but stale, `Ok(Err(None))` if absent.
pub(crate) fn cached_valid(
    ws: &Workspace,
    index: &Index,
    spec_dir: &Path,
    key: &str,
) -> Result<Result<Vec<OutputRecord>, Option<OutputProblem>>, StoreError> {
    let Some(outputs) = index.lookup_outputs(key)? else {
        return Ok(Err(None));
    };
    // The outputs as checked: a stat-only change is refreshed in them (and in the row).
    Ok(ws.check_outputs(index, key, outputs, spec_dir)?.map_err(Some))
}

impl NodeJob<'_> {
    /// Holds this node's outs in the user's tree ([`Workspace::lock_outs`]);
    /// a wait ends when the run is interrupted.
    pub(crate) fn lock_outs(&self, waiting: impl FnMut(&str)) -> Result<Option<crate::store::NodeLock>, StoreError> {
        self.ws.lock_outs(self.spec_dir, self.node.tree_outs(), waiting, &|| self.stopped())
    }

    /// Holds this node's key ([`Workspace::lock_node_until`]); a wait ends
    /// when the run is interrupted.
    pub(crate) fn lock_key(&self, key: &str, waiting: impl FnOnce()) -> Result<crate::store::NodeLock, StoreError> {
        self.ws.lock_node_until(key, waiting, &|| self.stopped())
    }

    /// Whether the run was interrupted (Ctrl-C, SIGTERM, SIGHUP): the
    /// coordinator's flag, or the signal itself before it saw it.
    fn stopped(&self) -> bool {
        self.cancel.load(std::sync::atomic::Ordering::SeqCst) || super::signal::interrupted()
    }

    /// [`cached_valid`] for this job's node: a re-check after waiting for someone else.
    pub(crate) fn cached_valid(
        &self,
        key: &str,
    ) -> Result<Result<Vec<OutputRecord>, Option<OutputProblem>>, StoreError> {
        cached_valid(self.ws, self.index, self.spec_dir, key)
    }
}

/// Runs the node's op into a staging folder, publishes its outputs, and commits its cache row.
type Summary = Option<crate::train::metrics::TrainingSummary>;

fn run_and_publish(job: &NodeJob<'_>, record: &HashInputs, key: &Key) -> Result<(Vec<OutputRecord>, Summary), String> {
    let started = Instant::now();
    let mut ran = run_op(job, record, key, &job.ws.log_path(key))?;
    let summary = ran.summary.take();
    if let Err(why) = deps_unchanged(job, record) {
        // Complete outputs, of bytes the key does not name: kept, out of the way.
        let mut moved = Vec::new();
        for rel in job.node.tree_outs() {
            match job.ws.move_out_to_trash(job.spec_dir, rel) {
                Ok(Some(m)) => moved.push(m.to.display().to_string()),
                Ok(None) => {}
                Err(e) => return Err(format!("{why} ({e})")),
            }
        }
        return Err(if moved.is_empty() {
            why
        } else {
            format!("{why} (its outs were moved into the workspace's trash: {})", moved.join(", "))
        });
    }
    let outputs = publish_and_commit(job, key, record, ran, started).map_err(|why| {
        // The node failed after its command wrote its outs into the tree: left
        // there, they would pass for a finished node's (Snakemake removes them too).
        let mut removed = Vec::new();
        for rel in job.node.tree_outs() {
            if crate::store::fsx::remove_out(job.spec_dir, rel).unwrap_or(false) {
                removed.push(rel.as_str());
            }
        }
        if removed.is_empty() {
            why
        } else {
            format!("{why} (its outs were removed from the tree, as the node did not complete: {})", removed.join(", "))
        }
    })?;
    Ok((outputs, summary))
}

/// Refuses a node whose deps changed while it ran: each file the key holds
/// (a file dep, a file of a folder or glob dep) and each params-file key the
/// key holds, checked against the key's (a file re-hashed only if its stat
/// changed). The outputs came from bytes the key may not name, so they are
/// not stored under it, as Bazel keeps an action whose inputs changed while
/// it ran out of its cache. A file added to a folder dep is not a change
/// here: the key never held it (the command may have written it, as Python
/// writes `__pycache__`), and the next `plan` sees it.
fn deps_unchanged(job: &NodeJob<'_>, record: &HashInputs) -> Result<(), String> {
    let node = job.node;
    let mut now = record.clone();
    // The file's hash now in `h`; `false` (the entry goes) where it is gone.
    let refresh = |path: &std::path::Path, h: &mut String| -> bool {
        let now = std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.is_file())
            .then(|| job.ws.hash_user_file(job.index, path).ok())
            .flatten();
        now.map(|current| *h = current).is_some()
    };
    now.files.retain(|rel, h| refresh(&job.spec_dir.join(rel), h));
    for tree in &node.trees {
        let Some(files) = now.trees.get_mut(&tree.name) else { continue };
        files.retain(|rel, h| refresh(&job.spec_dir.join(tree.file(rel)), h));
    }
    for (file, values) in now.params_files.iter_mut() {
        let doc = crate::docfile::read(job.spec_dir, file).ok();
        values.retain(|k, v| match doc.as_ref().and_then(|d| crate::docfile::lookup(d, k).ok()) {
            Some(current) => {
                *v = current.clone();
                true
            }
            None => false,
        });
    }
    let changes = crate::dag::key::diff(record, &now);
    if changes.is_empty() {
        return Ok(());
    }
    Err(format!(
        "its deps changed while the node ran ({}): its key holds them as they were before, so its outputs are not \
         stored under it. Run again (a node reads its deps and writes only its outs)",
        crate::dag::key::describe(&changes)
    ))
}

/// Runs the node's op (its inputs checked first) into a new staging folder,
/// its log in `log_path`.
/// What an op's run left: its staging folder, what its process cost and (a
/// training op's) its headline figures.
struct Ran {
    staging: crate::store::Staging,
    costs: Option<crate::costs::NodeCosts>,
    summary: Summary,
}

fn run_op(job: &NodeJob<'_>, record: &HashInputs, key: &Key, log_path: &Path) -> Result<Ran, String> {
    let staging = job.ws.staging().map_err(|e| e.to_string())?;
    let (costs, summary) = (std::sync::OnceLock::new(), std::sync::OnceLock::new());
    let mut inputs: BTreeMap<String, Vec<InputArtifact>> = BTreeMap::new();
    for (name, refs) in &job.node.inputs {
        // No op reads an input object whose bytes no longer hash to its name.
        for r in refs {
            let Some(out) = upstream_output(job.upstream, r) else {
                return Err(format!("input '{name}': output {r} is not available"));
            };
            if let Err(why) = job.ws.check_object(&out.object).map_err(|e| e.to_string())? {
                return Err(format!(
                    "input '{name}' ({r}) cannot be read: {why}. Node '{}' re-runs on the next `orchestrate run` to produce it again",
                    r.node
                ));
            }
        }
        let hashes = &record.inputs[name];
        let artifacts = refs
            .iter()
            .zip(hashes)
            .map(|(_, h)| InputArtifact { path: job.ws.object_path(h), hash: h.clone() })
            .collect();
        inputs.insert(name.clone(), artifacts);
    }
    let ctx = RunContext {
        node_id: job.node.id(),
        spec_dir: job.spec_dir,
        inputs: &inputs,
        staging: staging.path(),
        log_path,
        cancel: job.cancel,
        workspace: job.ws.root(),
        key,
        threads: job.env.as_ref().and_then(|e| e.threads),
        record,
        params_values: &record.params_files,
        costs: &costs,
        summary: &summary,
        outputs: &job.node.outputs,
    };
    job.node.op.run(&job.node.params, &ctx).map_err(|e| e.to_string())?;
    Ok(Ran { staging, costs: costs.into_inner(), summary: summary.into_inner() })
}

/// Stores a finished node's outputs and commits its record and cache row.
fn publish_and_commit(
    job: &NodeJob<'_>,
    key: &Key,
    record: &HashInputs,
    ran: Ran,
    started: Instant,
) -> Result<Vec<OutputRecord>, String> {
    let Ran { staging, costs, .. } = ran;
    // What the op's process cost goes into the record, beside the outputs.
    let outputs = publish_outputs(job, &staging)?;
    // The node's record and cache row commit last: a crash before this line
    // leaves no trace of the node but unreferenced objects.
    job.ws
        .commit_node(
            job.index,
            &CachedNode {
                key: key.clone(),
                node_id: job.node.id().to_string(),
                spec: job.spec_name.to_string(),
                record: record.clone(),
                outputs: outputs.clone(),
                seconds: started.elapsed().as_secs_f64(),
                finished_at: now_rfc3339(),
                run_id: job.run_id.to_string(),
                costs,
            },
        )
        .map_err(|e| e.to_string())?;
    Ok(outputs)
}

/// Re-executes a cached node (`run --check`, as `nix build --check`): its op
/// runs again on the same inputs under the node lock, each output is stored
/// by content (the cache's record is not touched) and compared with the
/// cached one, and outputs in the user's tree are put back as the cache has
/// them. `Ok(outputs)` are the re-executed ones.
pub fn recheck(job: &NodeJob<'_>, record: &HashInputs, cached: &CachedNode) -> Result<Vec<OutputRecord>, RecheckError> {
    let _lock = job.lock_key(&cached.key, || {})?;
    let _outs = job.lock_outs(|_| {})?;
    // The re-execution removes the outs in the tree, and the cached ones are
    // put back: bytes there the store lacks would be lost, so such a node is
    // not re-executed (nothing was checked).
    let kept = job.ws.unstored_edits(job.index, cached, job.spec_dir)?;
    if !kept.is_empty() {
        return Err(RecheckError::Edited(kept));
    }
    // Its own log beside the run's, which stays as it was.
    let ran = run_op(job, record, &cached.key, &job.ws.check_log_path(&cached.key));
    let outputs = ran.and_then(|ran| deps_unchanged(job, record).and_then(|()| publish_outputs(job, &ran.staging)));
    // The tree gets the cached outputs back whatever the re-execution wrote.
    job.ws.restore_outputs(job.index, cached, job.spec_dir, Replace::All)?;
    outputs.map_err(RecheckError::Node)
}

/// Why a re-execution did not give outputs to compare.
#[derive(Debug, thiserror::Error)]
pub enum RecheckError {
    /// The store (the node's lock, or putting the tree's outputs back).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The node itself: its op failed, or its outputs could not be stored
    /// (the message is the one a run would give).
    #[error("{0}")]
    Node(String),
    /// Outs in the tree hold bytes the store lacks, which the re-execution
    /// would remove: the node was not re-executed.
    #[error(
        "not re-executed: {}; the re-execution would remove them (it removes the outs, and the cached ones are \
         put back). Move them aside, or `checkout --force` (which moves them into the workspace's trash), and check \
         again",
        .0.iter().map(|k| format!("out '{}' holds bytes the store lacks ({})", k.path, k.changes)).collect::<Vec<_>>().join("; ")
    )]
    Edited(Vec<crate::store::KeptOut>),
}

/// Stores the outputs a node's op left (in staging, or in the user's tree) by content.
fn publish_outputs(job: &NodeJob<'_>, staging: &crate::store::Staging) -> Result<Vec<OutputRecord>, String> {
    let mut outputs = Vec::with_capacity(job.node.outputs.len());
    for decl in &job.node.outputs {
        let published = match &decl.workspace_path {
            Some(rel) => {
                let path = job.spec_dir.join(rel);
                let before = FileStat::of(&path).map_err(|e| format!("output '{rel}': {e}"))?;
                refuse_kept(rel, &path)?;
                let object = job.ws.publish_copy(&path, staging).map_err(|e| e.to_string())?;
                let after = FileStat::of(&path).map_err(|e| format!("output '{rel}': {e}"))?;
                if before != after {
                    return Err(format!(
                        "output '{rel}' changed while it was being stored; is something else writing it?"
                    ));
                }
                OutputRecord {
                    name: decl.name.clone(),
                    object,
                    workspace_path: Some(rel.clone()),
                    stat: Some(after),
                    dropped: None,
                }
            }
            None => {
                let staged = staging.path().join(&decl.name);
                if !staged.exists() {
                    return Err(format!("op '{}' did not write its output '{}'", job.node.op.name(), decl.name));
                }
                let object = job.ws.publish_move(&staged, decl.kind).map_err(|e| e.to_string())?;
                if decl.kind == OutputKind::File && object.kind != OutputKind::File {
                    return Err(format!("output '{}' should be a file", decl.name));
                }
                OutputRecord { name: decl.name.clone(), object, workspace_path: None, stat: None, dropped: None }
            }
        };
        outputs.push(published);
    }
    Ok(outputs)
}

/// Refuses to store a folder out holding what no out may hold (a
/// repository's `.git`, a workspace: [`crate::store::fsx::Kept`]): the next
/// run could not remove the out whole before its command, and would fail.
fn refuse_kept(rel: &str, path: &std::path::Path) -> Result<(), String> {
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    match crate::store::fsx::kept_within(path) {
        Ok(None) => Ok(()),
        Ok(Some(kept)) => Err(format!(
            "output '{rel}': {kept}; an out holding one is not stored, since an out is removed whole before its \
             command runs and this one never is. Leave it out of the out (copy the files without it, or remove it \
             at the end of the command)"
        )),
        Err(e) => Err(format!("output '{rel}': reading {}: {e}", path.display())),
    }
}

/// What a checkout restored, as people read it: `1 file, 22 B`, `4 files, 1.1 GB`.
pub fn files_and_bytes(files: u64, bytes: u64) -> String {
    format!("{files} file{}, {}", if files == 1 { "" } else { "s" }, human_bytes(bytes))
}

/// Bytes as people read them: `512 B`, `4.1 MB` (powers of 1000, as `du --si`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
