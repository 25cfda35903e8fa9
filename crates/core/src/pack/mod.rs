//! Frozen release packs: `pack freeze` writes a self-contained folder (outputs,
//! MANIFEST.json, the sealed event log, gate definitions and results, and
//! SHA256SUMS that `sha256sum -c` accepts); `pack verify` and `audit` check it
//! from its own files alone, with no workspace and no libtorch. A pack is never
//! appended to: freezing refuses an existing path (shared/seeds/000 documents
//! the mistake of appending to a released pack).

use crate::ops::artifacts::NodeKind;
use crate::ops::gate::GateOp;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

mod guard;
pub mod manifest;
pub mod sign;
use manifest::{Environment, EventsInfo, FreezeRecord, PackedGate, PackedNode, PackedOutput, SpecInfo};
pub use manifest::{Manifest, SealedEvent, FORMAT};

use crate::dag::key::canonical_json;
use crate::dag::Dag;
use crate::exec::plan::{plan, PlanState};
use crate::exec::EnvProvider;
use crate::exec::Event;
use crate::fsread::{self, BoundedFileError};
use crate::gate::{evaluate, read_gate_file, table, GateResult};
use crate::ops::OutputKind;
use crate::spec::Spec;
use crate::store::NodeOutcome;
use crate::store::{Key, Workspace};

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Path(#[from] PackPathError),
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    #[error(transparent)]
    Gate(#[from] crate::gate::GateError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PackError {
    let context = context.into();
    move |source| PackError::Io { context, source }
}

/// What goes into a pack besides the always-included outputs.
#[derive(Debug, Clone, Copy)]
pub struct FreezeOptions {
    /// Include model folders (large).
    pub with_models: bool,
    /// Include training states (large).
    pub with_states: bool,
    /// Outputs larger than this are listed with their hash but not copied.
    pub max_output_bytes: u64,
    /// What writes the pack's own `report.html` from the pack's files (the
    /// folder being frozen) and a title: the read side's renderer, which
    /// reads packs, so it is given here rather than called (`None`: a pack
    /// without a report, as packs frozen before reports were).
    pub report: Option<ReportRenderer>,
}

/// Renders a pack's report from its folder and a title.
pub type ReportRenderer = fn(&Path, &str) -> Result<String, Box<dyn std::error::Error + Send + Sync>>;

/// SHA-256 of a file, read in 1 MiB pieces (a pack may hold model weights).
fn sha256_file(path: &Path) -> Result<String, PackError> {
    Ok(hash_file_with(path, false)?.1)
}

/// The BLAKE3 (the store's name for an object) and the SHA-256 (its
/// SHA256SUMS line) of a packed file, from one read of it: a pack of a
/// 0.5B model's states read each of them twice after copying them.
fn blake3_and_sha256(path: &Path) -> Result<(String, String), PackError> {
    let (blake3, sha256) = hash_file_with(path, true)?;
    Ok((blake3.unwrap_or_default(), sha256))
}

fn hash_file_with(path: &Path, with_blake3: bool) -> Result<(Option<String>, String), PackError> {
    use std::io::Read;
    // What is hashed is the file opened: never a link's target, never a FIFO
    // waited on, even if the entry changed since the pack was listed.
    let mut file = fsread::open_regular(path, libc::O_NOFOLLOW).map_err(io(format!("reading {}", path.display())))?;
    let mut sha256 = Sha256::new();
    let mut blake3 = with_blake3.then(blake3::Hasher::new);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        sha256.update(&buf[..n]);
        if let Some(b) = blake3.as_mut() {
            b.update(&buf[..n]);
        }
    }
    Ok((blake3.map(|b| b.finalize().to_hex().to_string()), format!("{:x}", sha256.finalize())))
}

fn copy_object(src: &Path, dst: &Path) -> Result<(), PackError> {
    if src.is_dir() {
        fs::create_dir_all(dst).map_err(io(format!("creating {}", dst.display())))?;
        for entry in fs::read_dir(src).map_err(io(format!("listing {}", src.display())))? {
            let entry = entry.map_err(io("listing"))?;
            copy_object(&entry.path(), &dst.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        }
        fs::copy(src, dst).map_err(io(format!("copying {}", src.display())))?;
        // Packs are read-write copies; objects in the store are read-only.
        let mut perms = fs::metadata(dst).map_err(io("reading permissions"))?.permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(dst, perms).map_err(io("setting permissions"))
    }
}

/// Files under a folder, relative, sorted.
fn list_files(root: &Path) -> Result<Vec<String>, PackError> {
    Ok(list_entries(root)?.0)
}

/// Regular files under a folder, and everything else (symlinks, sockets, ...)
/// with what it is; relative, sorted. Links are never followed, into folders either.
fn list_entries(root: &Path) -> Result<(Vec<String>, BTreeMap<String, &'static str>), PackError> {
    let (mut files, mut others) = (Vec::new(), BTreeMap::new());
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for entry in fs::read_dir(&dir).map_err(io(format!("listing {}", dir.display())))? {
            let entry = entry.map_err(io("listing"))?;
            let child = rel.join(entry.file_name());
            let kind = entry.file_type().map_err(io("reading a file type"))?;
            if kind.is_dir() {
                stack.push(child);
            } else if kind.is_file() {
                files.push(child.to_string_lossy().into_owned());
            } else {
                let what = if kind.is_symlink() { "a symlink" } else { "not a regular file" };
                others.insert(child.to_string_lossy().into_owned(), what);
            }
        }
    }
    files.sort();
    Ok((files, others))
}

/// A path a pack names (in SHA256SUMS or its manifest) as a path inside the
/// pack: relative, without `..`, and with no symlink on the way. Anything else
/// is refused, and never opened.
pub fn inside(dir: &Path, rel: &str) -> Result<PathBuf, PackPathError> {
    let path = Path::new(rel);
    let plain = !rel.is_empty() && path.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain {
        return Err(PackPathError::Outside { rel: rel.to_string() });
    }
    let mut at = dir.to_path_buf();
    for c in path.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => return Err(PackPathError::Link { rel: rel.to_string(), at }),
            _ => {}
        }
    }
    Ok(at)
}

/// A path a pack names that is refused, and never opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackPathError {
    #[error("{rel} is outside the pack (a pack names only relative paths inside it)")]
    Outside { rel: String },
    #[error("{rel}: {} is a symlink (a pack holds only regular files)", .at.display())]
    Link { rel: String, at: PathBuf },
}

/// A root digest given by hand that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a root digest: expected sha256: and 64 hex digits (what `pack freeze` prints)")]
pub struct DigestError(pub String);

/// The node and key an engine event names, read from any event of any
/// version (the rest of it is not looked at): what ties a pack's events to
/// its results.
#[derive(serde::Deserialize)]
struct KeyedEvent {
    #[serde(default)]
    event: Option<EventKind>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    key: Option<Key>,
}

/// The one kind of engine event ([`Event`]'s tag) a pack's check tells apart.
#[derive(serde::Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum EventKind {
    NodeFailed,
    #[serde(other)]
    Other,
}

/// Why event `seq` (read as a [`KeyedEvent`]) is not of the results `keys` (by node
/// id): it names a node with another key, or a node they lack, or says a
/// packed result failed (a later `--force` that failed). `None` when it names
/// none, or one with its key.
fn foreign_event(seq: usize, event: KeyedEvent, keys: &BTreeMap<&str, &Key>) -> Option<String> {
    let KeyedEvent { event, node: Some(node), key: Some(key) } = event else {
        return None;
    };
    let failed = event == Some(EventKind::NodeFailed);
    match keys.get(node.as_str()) {
        Some(packed) if **packed == key && failed => {
            Some(format!("event {seq} says node '{node}' failed with key {}, the result the pack holds", key.short()))
        }
        Some(packed) if **packed == key => None,
        Some(packed) => Some(format!(
            "event {seq} names node '{node}' with key {}, but the pack holds its result {}",
            key.short(),
            packed.short()
        )),
        None => Some(format!("event {seq} names node '{node}' (key {}), which the pack lacks", key.short())),
    }
}

/// The seal of an event: blake3 over the previous seal, its position and its canonical JSON.
fn seal(prev: &str, seq: usize, event: &Value) -> String {
    let mut h = blake3::Hasher::new();
    h.update(prev.as_bytes());
    h.update(format!("\n{seq}\n").as_bytes());
    h.update(canonical_json(event).as_bytes());
    h.finalize().to_hex().to_string()
}

/// Freezes the cached results of a spec into `out`.
pub fn freeze(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    env: &EnvProvider,
    out: &Path,
    opts: FreezeOptions,
) -> Result<Manifest, PackError> {
    if out.exists() {
        return Err(PackError::Refused(format!(
            "{} already exists: a pack is never appended to or overwritten after release; freeze into a new version folder",
            out.display()
        )));
    }
    let entries = plan(Some(ws), spec, dag, &BTreeSet::new(), env)?;
    let stale: Vec<&str> =
        entries.iter().filter(|e| !matches!(e.state, PlanState::Cached { .. })).map(|e| e.node.as_str()).collect();
    if !stale.is_empty() {
        return Err(PackError::Refused(format!(
            "not everything is cached as the spec stands ({}): run `orchestrate run {}` first",
            stale.join(", "),
            spec.path.display()
        )));
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "pack".into());
    let tmp = parent.join(format!(".{name}.partial-{}", crate::store::objects::unique_suffix()));
    let result = (|| -> Result<Manifest, PackError> {
        fs::create_dir_all(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
        let index = ws.index()?;
        let mut nodes = Vec::new();
        let mut gate_nodes = Vec::new();
        let mut packed: BTreeMap<(String, String), String> = BTreeMap::new();
        // Every path written into the pack, so none is ever written twice.
        let mut written: BTreeSet<String> = BTreeSet::new();
        // The SHA-256 of each packed output file, taken as it was checked.
        let mut sha256_of: BTreeMap<String, String> = BTreeMap::new();
        for &pos in &dag.order {
            let node = &dag.nodes[pos];
            let key = match &entries.iter().find(|e| e.node == node.id()).map(|e| &e.state) {
                Some(PlanState::Cached { key }) => key.clone(),
                _ => unreachable!("checked above"),
            };
            let cached = index
                .lookup(&key)?
                .ok_or_else(|| PackError::Refused(format!("cache row of {} vanished", node.id())))?;
            let mut outs = Vec::new();
            for o in &cached.outputs {
                if !o.stored() && (opts.with_states || o.name != "state") {
                    return Err(PackError::Refused(format!(
                        "output '{}' of node '{}' was {}: run `orchestrate run SPEC --force {}` to make it again, then freeze",
                        o.name,
                        node.id(),
                        o.dropped.as_deref().unwrap_or("dropped"),
                        node.id()
                    )));
                }
                // A GRPO node's rollouts are a folder, but evidence (the tokens
                // its guard log vouches for), not a model: packed by default.
                let evidence =
                    crate::ops::artifacts::ArtifactKind::Rollouts.output_of(node.op.name()) == Some(o.name.as_str());
                let omitted = match (o.object.kind, o.name.as_str()) {
                    (OutputKind::Dir, _) if !evidence && !opts.with_models => {
                        Some("a folder (model): use --with-models")
                    }
                    (_, "state") if !opts.with_states => Some("a training state: use --with-states"),
                    _ if o.object.size > opts.max_output_bytes => Some("larger than --max-output-bytes"),
                    _ => None,
                };
                let path = format!("outputs/{}/{}", node.id(), o.name);
                if omitted.is_none() && !written.insert(path.clone()) {
                    return Err(PackError::Refused(format!(
                        "two files of the pack would both be {path}: refusing to freeze a pack that loses one"
                    )));
                }
                if omitted.is_none() {
                    copy_object(&ws.object_path(&o.object.hash), &tmp.join(&path))?;
                    // What is packed is what the record names: a damaged
                    // object (edited in place, rotted) is never sealed. A
                    // file's SHA-256 comes from the same read.
                    let intact = match o.object.kind {
                        OutputKind::File => {
                            let (blake3, sha256) = blake3_and_sha256(&tmp.join(&path))?;
                            sha256_of.insert(path.clone(), sha256);
                            blake3 == o.object.hash
                        }
                        OutputKind::Dir => {
                            crate::store::objects::intact(&tmp.join(&path), &o.object.hash, o.object.kind)?
                                == Some(true)
                        }
                    };
                    if !intact {
                        return Err(PackError::Refused(format!(
                            "output '{}' of node '{}' in the store no longer hashes to its name {}: it was damaged \
                             after it was stored (`orchestrate verify` lists every such object). Run \
                             `orchestrate run {} --force {}`, which stores it again, then freeze",
                            o.name,
                            node.id(),
                            &o.object.hash[..12],
                            spec.path.display(),
                            node.id()
                        )));
                    }
                    packed.insert((node.id().to_string(), o.name.clone()), path.clone());
                }
                outs.push(PackedOutput {
                    name: o.name.clone(),
                    blake3: o.object.hash.clone(),
                    size: o.object.size,
                    kind: o.object.kind,
                    path: omitted.is_none().then(|| path.clone()),
                    omitted: omitted.map(str::to_string),
                });
            }
            if let Some(gate) = node.params.as_typed::<crate::ops::gate::GateParams>() {
                let file = gate.file.as_str();
                let gate_path = crate::gate::gate_file_path(&spec.base_dir, file)?;
                let file_name =
                    Path::new(file).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                // Under the node's id: two gate nodes whose files share a name
                // (a/g.yaml, b/g.yaml) can never meet at one path.
                let pack_gate = format!("gates/{}/{file_name}", node.id());
                if !written.insert(pack_gate.clone()) {
                    return Err(PackError::Refused(format!(
                        "two files of the pack would both be {pack_gate}: refusing to freeze a pack that loses one"
                    )));
                }
                copy_object(&gate_path, &tmp.join(&pack_gate))?;
                // The definition packed is the one the gate node evaluated:
                // the bytes its record keys (a file edited since the plan
                // above would give the audit other criteria).
                let (copied, _) = crate::store::hash_file(&tmp.join(&pack_gate))?;
                if cached.record.file_dep_hash(file) != Some(copied.as_str()) {
                    return Err(PackError::Refused(format!(
                        "gate file {file} of node '{}' is not the one its cached result was evaluated with (it changed \
                         while the pack was frozen?): run `orchestrate run {}` again, then freeze",
                        node.id(),
                        spec.path.display()
                    )));
                }
                let evidence: BTreeMap<String, String> = node
                    .inputs
                    .iter()
                    .filter_map(|(k, refs)| k.strip_prefix("evidence:").map(|r| (r.to_string(), refs[0].clone())))
                    .map(|(r, o)| (r, packed.get(&(o.node, o.output)).cloned().unwrap_or_default()))
                    .collect();
                if let Some((r, _)) = evidence.iter().find(|(_, p)| p.is_empty()) {
                    return Err(PackError::Refused(format!(
                        "gate evidence {r} was omitted from the pack; it must be included"
                    )));
                }
                gate_nodes.push(PackedGate {
                    node: node.id().to_string(),
                    definition: pack_gate,
                    results: packed.get(&(node.id().to_string(), GateOp::REPORT.to_string())).cloned(),
                    evidence,
                });
            }
            nodes.push(PackedNode {
                id: node.id().to_string(),
                op: node.op.name().to_string(),
                op_version: node.op.version(),
                key,
                inputs: node.inputs.clone(),
                hash_inputs: cached.record.clone(),
                outputs: outs,
                finished_at: cached.finished_at.clone(),
                costs: cached.costs.clone(),
            });
        }
        // The event log of the latest run of this spec whose events name the
        // packed results (a later try with other params names other keys),
        // sealed into a chain.
        let keys: BTreeMap<&str, &Key> = nodes.iter().map(|n: &PackedNode| (n.id.as_str(), &n.key)).collect();
        let (mut run, mut other) = (None, None);
        for r in index.recent_runs(usize::MAX >> 1)?.into_iter().filter(|r| r.spec == spec.name) {
            let texts = index.run_events(&r.run_id)?;
            let foreign = texts
                .iter()
                .enumerate()
                .find_map(|(seq, text)| foreign_event(seq, serde_json::from_str(text).ok()?, &keys));
            match foreign {
                None => {
                    run = Some((r, texts));
                    break;
                }
                Some(why) => {
                    other.get_or_insert((r.run_id, why));
                }
            }
        }
        if let (None, Some((run_id, why))) = (&run, other) {
            return Err(PackError::Refused(format!(
                "no run of '{}' in this workspace names the results being packed (its latest, {run_id}: {why}), so \
                 the pack would seal another computation's events. Run `orchestrate run {}` (every node is cached: \
                 it records a run of them), then freeze",
                spec.name,
                spec.path.display()
            )));
        }
        let mut events = String::new();
        let mut prev = String::from("genesis");
        if let Some((run, texts)) = &run {
            for (seq, text) in texts.iter().enumerate() {
                let event: Value = serde_json::from_str(text).map_err(|e| {
                    PackError::Refused(format!("event {seq} of run {} in the index is not JSON: {e}", run.run_id))
                })?;
                let s = seal(&prev, seq, &event);
                let line = SealedEvent { seq, prev: prev.clone(), event, seal: s.clone() };
                events.push_str(&serde_json::to_string(&line).expect("events serialize"));
                events.push('\n');
                prev = s;
            }
        }
        fs::write(tmp.join("events.jsonl"), &events).map_err(io("writing events.jsonl"))?;
        let guard = guard::freeze(ws, &nodes, &tmp)?;
        let numerical = dag.nodes.iter().any(|n| n.op.numerical());
        let torch = if numerical { env().ok() } else { None };
        let git = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&spec.base_dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        let manifest = Manifest {
            format: FORMAT.to_string(),
            spec: SpecInfo {
                name: spec.name.clone(),
                path: spec.path.clone(),
                profile: spec.profile.clone(),
                resolved: spec.resolved.clone(),
            },
            nodes,
            gates: gate_nodes,
            events: EventsInfo {
                run_id: run.as_ref().map(|(r, _)| r.run_id.clone()),
                file: "events.jsonl".into(),
                last_seal: prev,
            },
            guard,
            environment: Environment {
                orchestrate_version: env!("CARGO_PKG_VERSION").to_string(),
                git_commit: git,
                libtorch: torch.as_ref().map(|e| e.libtorch.clone()),
                device: torch.as_ref().map(|e| e.device.clone()),
                cpu_capability: torch.as_ref().and_then(|e| e.cpu.clone()),
                cpu_vendor: torch.as_ref().and_then(|e| e.cpu_vendor.clone()),
                cpu_model: torch.as_ref().and(crate::runtime::cpu_model()),
                threads: torch.as_ref().and_then(|e| e.threads),
                os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            },
            frozen_at: crate::store::now_rfc3339(),
            options: FreezeRecord {
                with_models: opts.with_models,
                with_states: opts.with_states,
                max_output_bytes: opts.max_output_bytes,
            },
        };
        fs::write(
            tmp.join("MANIFEST.json"),
            serde_json::to_string_pretty(&manifest).expect("a manifest serializes") + "\n",
        )
        .map_err(io("writing MANIFEST.json"))?;
        // The pack's own HTML report, made from the pack's files alone and sealed with them.
        if let Some(render) = opts.report {
            let title = format!("pack {} (frozen {})", manifest.spec.name, manifest.frozen_at);
            let html = render(&tmp, &title).map_err(|e| PackError::Refused(format!("the report: {e}")))?;
            fs::write(tmp.join("report.html"), html).map_err(io("writing report.html"))?;
        }
        let mut sums = String::new();
        for f in list_files(&tmp)? {
            let sha256 = match sha256_of.remove(&f) {
                Some(known) => known,
                None => sha256_file(&tmp.join(&f))?,
            };
            sums.push_str(&format!("{sha256}  {f}\n"));
        }
        fs::write(tmp.join("SHA256SUMS"), sums).map_err(io("writing SHA256SUMS"))?;
        Ok(manifest)
    })();
    match result {
        Ok(manifest) => {
            fs::rename(&tmp, out).map_err(io(format!("publishing {}", out.display())))?;
            Ok(manifest)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// SHA256SUMS larger than this is not read (a line per file: a pack of a
/// million files stays under it).
pub const MAX_SUMS_BYTES: u64 = 128 << 20;

/// The largest event log a pack's report reads.
pub const MAX_EVENTS_BYTES: u64 = 256 << 20;

/// Reads a pack's event log as text: a regular file (not a link) of bounded
/// size, checked on the file opened (no gap between a check and the read).
fn read_bounded(path: &Path) -> Result<String, String> {
    fsread::read_bounded_text(path, MAX_EVENTS_BYTES).map_err(|e| match e {
        BoundedFileError::NotAFile { .. } => "not a regular file (a pack holds only regular files)".to_string(),
        BoundedFileError::TooLarge { bytes, max, .. } => format!("{bytes} bytes, over the limit of {max}"),
        BoundedFileError::Io { source, .. } => source.to_string(),
    })
}

/// Reads a pack's SHA256SUMS: a regular file (not a link) of bounded size,
/// checked on the file opened.
fn read_sums(dir: &Path) -> Result<Vec<u8>, String> {
    let path = dir.join("SHA256SUMS");
    fsread::read_bounded_file(&path, MAX_SUMS_BYTES).map_err(|e| match e {
        BoundedFileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            format!("{}: not a pack (no SHA256SUMS: {source})", dir.display())
        }
        BoundedFileError::NotAFile { .. } => {
            format!("{}: not a regular file (a pack holds only regular files)", path.display())
        }
        other => other.to_string(),
    })
}

/// The pack's root digest: the SHA-256 of its SHA256SUMS, as `sha256:HEX`.
/// Every file of the pack is bound to it through its sum, so a release note
/// or a git tag that carries it pins the whole pack (`audit --expect`).
pub fn root_digest(dir: &Path) -> Result<String, PackError> {
    let bytes = read_sums(dir).map_err(PackError::Refused)?;
    Ok(format!("sha256:{:x}", Sha256::digest(&bytes)))
}

/// Parses a digest given by hand (`sha256:HEX` or bare `HEX`) into `sha256:hex`.
pub fn parse_digest(text: &str) -> Result<String, DigestError> {
    let hex = text.strip_prefix("sha256:").unwrap_or(text);
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(DigestError(text.to_string()));
    }
    Ok(format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// Everything wrong with a pack, one precise message each; empty when intact.
/// Only a folder that does not exist is an error: anything wrong inside one
/// (even a missing SHA256SUMS) is a problem of the pack.
pub fn verify(dir: &Path) -> Result<Vec<String>, PackError> {
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(PackError::Refused(format!("{}: no such pack folder", dir.display())));
    }
    let mut problems = Vec::new();
    let sums = match read_sums(dir).map(String::from_utf8) {
        Ok(Ok(text)) => text,
        Ok(Err(_)) => {
            problems.push("SHA256SUMS is not UTF-8 text".to_string());
            String::new()
        }
        Err(e) => {
            problems.push(e);
            String::new()
        }
    };
    let mut listed: BTreeMap<String, String> = BTreeMap::new();
    for (i, line) in sums.lines().enumerate() {
        match line.split_once("  ") {
            Some((hash, path)) => {
                if let Err(e) = inside(dir, path) {
                    problems.push(format!("SHA256SUMS line {}: {e}", i + 1));
                } else if listed.insert(path.to_string(), hash.to_string()).is_some() {
                    problems.push(format!("{path} is listed twice in SHA256SUMS (line {})", i + 1));
                }
            }
            None => problems.push(format!("SHA256SUMS line {} is malformed", i + 1)),
        }
    }
    let (files, others) = list_entries(dir)?;
    for (other, what) in &others {
        problems.push(format!("{other} is {what}: a pack holds only regular files, and links are never followed"));
    }
    // SHA256SUMS, and the signature over every file (SHA256SUMS included),
    // which `audit --key` checks: neither can be listed in SHA256SUMS.
    let present: BTreeSet<String> =
        files.into_iter().filter(|f| f != "SHA256SUMS" && f != sign::SIGNATURE_FILE).collect();
    for (path, expected) in &listed {
        if !present.contains(path) {
            if !others.contains_key(path) {
                problems.push(format!("missing: {path} is listed in SHA256SUMS but absent from the pack"));
            }
            continue;
        }
        let actual = sha256_file(&dir.join(path))?;
        if &actual != expected {
            let what = if path == "MANIFEST.json" {
                "the manifest was edited after freezing".to_string()
            } else if path.starts_with("gates/") {
                format!("gate definition {path} was edited after freezing")
            } else if path == "events.jsonl" {
                "the event log was edited after freezing".to_string()
            } else {
                format!("{path} was edited after freezing")
            };
            problems.push(format!("checksum mismatch: {what} (sha256 {actual}, SHA256SUMS says {expected})"));
        }
    }
    for extra in present.iter().filter(|p| !listed.contains_key(*p)) {
        problems.push(format!("extra: {extra} is in the pack but not in SHA256SUMS (a pack is never appended to)"));
    }
    let manifest = Manifest::read(dir);
    // The event chain: order, links and seals.
    if let Ok(text) = read_bounded(&dir.join("events.jsonl")) {
        let mut prev = String::from("genesis");
        for (i, line) in text.lines().enumerate() {
            let v: SealedEvent = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(e) => {
                    problems.push(format!("events.jsonl line {} is not a sealed event: {e}", i + 1));
                    break;
                }
            };
            if v.seq != i {
                problems.push(format!("events reordered or removed: line {} holds event {}", i + 1, v.seq));
                break;
            }
            if v.prev != prev {
                problems.push(format!("event chain broken at event {i}: it does not follow the previous seal"));
                break;
            }
            let expected = seal(&prev, i, &v.event);
            if v.seal != expected {
                problems.push(format!("event {i} was edited: its seal does not match its content"));
                break;
            }
            prev = expected;
        }
        if let Ok(manifest) = &manifest {
            if manifest.events.last_seal != prev {
                problems.push(
                    "the event chain's last seal differs from the manifest's: events were removed or appended".into(),
                );
            }
            // The events are of the packed results, not of another computation.
            let keys: BTreeMap<&str, &Key> = manifest.nodes.iter().map(|n| (n.id.as_str(), &n.key)).collect();
            let foreign = text.lines().enumerate().find_map(|(i, line)| {
                let sealed: SealedEvent = serde_json::from_str(line).ok()?;
                foreign_event(i, serde::Deserialize::deserialize(&sealed.event).ok()?, &keys)
            });
            if let Some(why) = foreign {
                problems.push(format!("events.jsonl is not the log of the packed results: {why}"));
            }
        }
    }
    // Packed outputs against the manifest's content hashes.
    match manifest {
        Ok(manifest) => {
            let named = manifest
                .nodes
                .iter()
                .flat_map(|n| n.outputs.iter().filter_map(|o| o.path.as_deref()))
                .chain(manifest.gates.iter().flat_map(|g| {
                    std::iter::once(g.definition.as_str())
                        .chain(g.results.as_deref())
                        .chain(g.evidence.values().map(String::as_str))
                }))
                .chain(std::iter::once(manifest.events.file.as_str()))
                .chain(manifest.guard.iter().map(|c| c.file.as_str()));
            for path in named {
                if let Err(e) = inside(dir, path) {
                    problems.push(format!("MANIFEST.json names {e}"));
                }
            }
            agree(&manifest, &listed, &mut problems);
            guard::verify(dir, &manifest, &mut problems);
            for o in manifest.nodes.iter().flat_map(|n| &n.outputs) {
                let Some(path) = &o.path else { continue };
                // A path outside the pack, or what is missing, was reported
                // above. Each output is hashed as the store hashes an object (a
                // folder: its files' hashes in order), so an edit that rewrote
                // SHA256SUMS to match is still caught.
                let Ok(p) = inside(dir, path) else { continue };
                if !matches!(crate::store::objects::intact(&p, &o.blake3, o.kind), Ok(Some(true) | None)) {
                    problems.push(format!("{path} does not match the content hash recorded in the manifest"));
                }
            }
        }
        Err(e) => problems.push(format!("the manifest cannot be read: {e}")),
    }
    Ok(problems)
}

/// SHA256SUMS and the manifest agree: every file listed is one the manifest
/// names (its fixed files, a packed output or a file inside a packed folder, a
/// gate definition), every file the manifest names is listed, every gate node
/// has its gate entry (so the gates evaluated are exactly those the pack
/// defines), and each gate's results and evidence are the packed outputs they
/// stand for.
fn agree(manifest: &Manifest, listed: &BTreeMap<String, String>, problems: &mut Vec<String>) {
    // report.html is the pack's own report (absent from packs frozen before it existed).
    let optional = ["report.html"];
    let mut files: BTreeSet<&str> = ["MANIFEST.json", manifest.events.file.as_str()].into();
    files.extend(manifest.guard.iter().map(|c| c.file.as_str()));
    let mut folders: Vec<String> = Vec::new();
    let mut output_paths: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for n in &manifest.nodes {
        for o in &n.outputs {
            let Some(path) = o.path.as_deref() else { continue };
            output_paths.insert((n.id.as_str(), o.name.as_str()), path);
            match o.kind {
                OutputKind::Dir => folders.push(format!("{path}/")),
                _ => {
                    files.insert(path);
                }
            }
        }
    }
    let definitions: BTreeSet<&str> = manifest.gates.iter().map(|g| g.definition.as_str()).collect();
    for path in listed.keys() {
        let named = files.contains(path.as_str())
            || optional.contains(&path.as_str())
            || definitions.contains(path.as_str())
            || folders.iter().any(|f| path.starts_with(f));
        if named {
            continue;
        }
        problems.push(if path.starts_with("gates/") {
            format!(
                "gate definition {path} is in the pack but no gate of the manifest names it: its gates would not be evaluated"
            )
        } else {
            format!("{path} is listed in SHA256SUMS but not named by the manifest")
        });
    }
    for path in files.iter().chain(&definitions) {
        if !listed.contains_key(*path) {
            problems.push(format!("MANIFEST.json names {path}, which SHA256SUMS does not list"));
        }
    }
    let gate_nodes: BTreeSet<&str> =
        manifest.nodes.iter().filter(|n| NodeKind::of(&n.op) == NodeKind::Gate).map(|n| n.id.as_str()).collect();
    let entries: BTreeSet<&str> = manifest.gates.iter().map(|g| g.node.as_str()).collect();
    for missing in gate_nodes.difference(&entries) {
        problems.push(format!(
            "gate node '{missing}' has no entry in the manifest's gate list: its gates would not be evaluated"
        ));
    }
    for g in &manifest.gates {
        if !gate_nodes.contains(g.node.as_str()) {
            problems.push(format!("the manifest's gate list names '{}', which is not a gate node of the pack", g.node));
            continue;
        }
        let packed_results = output_paths.get(&(g.node.as_str(), GateOp::REPORT)).copied();
        if g.results.as_deref() != packed_results {
            problems.push(format!(
                "gate '{}': its results are {}, but the node's packed gates.json is {}",
                g.node,
                g.results.as_deref().unwrap_or("not recorded"),
                packed_results.unwrap_or("not packed")
            ));
        }
        for (reference, path) in &g.evidence {
            let packed = output_paths
                .iter()
                .find(|((node, output), _)| format!("{node}:{output}") == *reference)
                .map(|(_, p)| *p);
            if packed != Some(path.as_str()) {
                problems.push(format!(
                    "gate '{}': evidence {reference} is read from {path}, but the manifest packs that output {}",
                    g.node,
                    packed.map(|p| format!("at {p}")).unwrap_or_else(|| "nowhere".into())
                ));
            }
        }
    }
}

pub use crate::gate::MAX_EVIDENCE_BYTES;

/// Re-evaluates every gate from the pack's own files and definitions.
pub fn audit_gates(dir: &Path) -> Result<Vec<GateResult>, PackError> {
    let manifest = Manifest::read(dir)?;
    let mut results = Vec::new();
    for g in &manifest.gates {
        let definition = inside(dir, &g.definition).map_err(|e| PackError::Refused(format!("gate definition {e}")))?;
        let file = read_gate_file(&definition)?;
        let evidence_paths = &g.evidence;
        for gate in &file.gates {
            let mut loaded = BTreeMap::new();
            let mut hashes = BTreeMap::new();
            let mut unreadable = None;
            for (alias, reference) in &gate.evidence {
                let file = evidence_paths.get(reference).and_then(|path| inside(dir, path).ok());
                let text = match file.map(|p| fsread::read_bounded_text(&p, MAX_EVIDENCE_BYTES)) {
                    Some(Ok(text)) => text,
                    Some(Err(BoundedFileError::TooLarge { .. })) => {
                        unreadable = Some(crate::gate::evidence_too_large(reference));
                        break;
                    }
                    None | Some(Err(_)) => {
                        unreadable = Some(format!("cannot evaluate: evidence {reference} is missing from the pack"));
                        break;
                    }
                };
                let path = &evidence_paths[reference];
                let value = match crate::ops::gate::parse_evidence(reference, &text) {
                    Ok(v) => v,
                    Err(why) => {
                        unreadable = Some(format!("cannot evaluate: {why}"));
                        break;
                    }
                };
                loaded.insert(alias.clone(), value);
                hashes.insert(
                    alias.clone(),
                    (
                        reference.clone(),
                        inside(dir, path)
                            .ok()
                            .and_then(|p| crate::store::hash_file(&p).ok())
                            .map(|(h, _)| h)
                            .unwrap_or_default(),
                    ),
                );
            }
            // Missing evidence fails the gate (verify names the missing file); it is not an error.
            results.push(match unreadable {
                Some(detail) => GateResult::unevaluated(gate, detail, hashes),
                None => evaluate(gate, &loaded, &hashes),
            });
        }
    }
    Ok(results)
}

/// A printable gate table.
pub fn gate_table(results: &[GateResult]) -> String {
    table(results)
}

/// Each node's outcome in a pack's sealed event log, with its seconds where
/// it ran or failed (a node the log does not name is absent). The log is
/// read bounded, like every file a pack holds, and a missing one is an error,
/// not "frozen" nodes.
pub fn node_outcomes(
    dir: &Path,
    manifest: &Manifest,
) -> Result<BTreeMap<String, (NodeOutcome, Option<f64>)>, PackError> {
    let events_path = inside(dir, &manifest.events.file)?;
    let refused = |e: String| PackError::Refused(format!("{}: {e}", events_path.display()));
    let events = read_bounded(&events_path).map_err(refused)?;
    let mut outcome = BTreeMap::new();
    for (i, line) in events.lines().enumerate() {
        let sealed: SealedEvent = serde_json::from_str(line).map_err(|e| refused(format!("line {}: {e}", i + 1)))?;
        let (node, o, seconds) = match sealed.engine_event().map_err(|e| refused(e.to_string()))? {
            Event::CacheHit { node, .. } => (node, NodeOutcome::Cached, None),
            Event::NodeFinished { node, seconds, .. } => (node, NodeOutcome::Ran, Some(seconds)),
            Event::NodeFailed { node, seconds, .. } => (node, NodeOutcome::Failed, Some(seconds)),
            Event::NodeSkipped { node, .. } => (node, NodeOutcome::Skipped, None),
            _ => continue,
        };
        outcome.insert(node, (o, seconds));
    }
    Ok(outcome)
}
