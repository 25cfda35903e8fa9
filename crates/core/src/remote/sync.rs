//! Push and pull: what moves between the local store and a remote, in which
//! order, and what is checked on the way in.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{is_hex64, object_key, record_key, Remote, RemoteError};
use crate::store::objects::{dir_listing, ListedFile, DIR_LISTING_HEADER};
use crate::store::{CachedNode, Index, Key, OutputKind, OutputRecord, Workspace};
use crate::trust::record::{sign, signed_payload};
use crate::trust::{RecordSignature, Verified};

/// A record larger than this is not read (the largest a node writes, a
/// results table's with every score as an input, is a few KB; nesting is
/// bounded by serde_json's recursion limit of 128).
pub const MAX_RECORD_BYTES: u64 = 4 << 20;
/// A folder listing larger than this is not read.
const MAX_LISTING_BYTES: u64 = 64 << 20;
/// Files one folder object may hold.
const MAX_DIR_FILES: u64 = 1_000_000;

/// The largest object a record may declare (`ORCHESTRATE_REMOTE_MAX_BYTES`,
/// default 64 GiB): anything bigger is refused before a byte is fetched.
pub fn max_object_bytes() -> u64 {
    std::env::var("ORCHESTRATE_REMOTE_MAX_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(64 << 30)
}

/// What a push or pull did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Transfer {
    /// Nodes whose record was sent or received.
    pub nodes: usize,
    /// Nodes already there (push: the remote has the record; pull: cached here).
    pub present: usize,
    /// Objects (files, folder listings) sent or received.
    pub objects: usize,
    pub bytes: u64,
    /// Nodes the remote does not have (pull).
    pub missing: Vec<String>,
    /// What failed, naming the node and object; nothing of it was published.
    pub failed: Vec<String>,
    /// Nodes taken without a trusted signature although the workspace
    /// requires one (`--trust-unsigned`), and why each is unverified.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<String>,
    /// Records on the remote that this push counter-signed (push: the same
    /// outputs were made here).
    #[serde(skip_serializing_if = "is_zero")]
    pub countersigned: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A record as the remote keeps it: the node (without local stats) and the
/// signatures of those who vouch for its outputs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RemoteRecord {
    #[serde(flatten)]
    pub node: CachedNode,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signatures: Vec<RecordSignature>,
}

/// Runs `f` over `items` on at most `jobs` threads; results in item order.
fn parallel<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() {
                    break;
                }
                let r = f(&items[i]);
                out.lock().expect("no thread panics holding it")[i] = Some(r);
            });
        }
    });
    out.into_inner().expect("threads joined").into_iter().map(|r| r.expect("every item ran")).collect()
}

/// A progress bar of bytes on a terminal; silent otherwise.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    pub bytes: AtomicU64,
}

impl Progress {
    pub fn new(show: bool, what: &str) -> Progress {
        let bar = show.then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            b.set_message(what.to_string());
            b
        });
        Progress { bar, bytes: AtomicU64::new(0) }
    }

    fn grow(&self, total: u64) {
        if let Some(b) = &self.bar {
            b.inc_length(total);
        }
    }

    fn add(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// One object to send: a file (`listing: None`) or a folder's listing, sent
/// after each of its files.
struct Upload {
    node: String,
    hash: String,
    path: PathBuf,
    /// A folder: its files (each an object) and the listing's bytes.
    listing: Option<(Vec<ListedFile>, Vec<u8>)>,
}

/// The record as the remote keeps it: the local stat of outputs in the user's
/// tree means nothing elsewhere.
fn portable(node: &CachedNode) -> CachedNode {
    let mut n = node.clone();
    for o in &mut n.outputs {
        o.stat = None;
    }
    n
}

/// Sends `nodes` (records and objects) to the remote: for each node whose
/// record the remote lacks, every object it lacks (a HEAD each), then, once
/// all of a node's objects are there, its record. A local object that no
/// longer hashes to its name is never sent.
pub fn push(
    ws: &Workspace,
    remote: &Remote,
    nodes: &[CachedNode],
    progress: &Progress,
) -> Result<Transfer, RemoteError> {
    let backend = remote.backend.as_ref();
    let mut t = Transfer::default();
    // Which records the remote has: one listing when that is cheaper than a
    // HEAD per node (as DVC weighs listing against queries), else HEADs.
    let listed = known_keys(remote, "records/", nodes.len())?;
    let have = parallel(nodes, remote.jobs, |n| {
        let key = record_key(&n.key);
        match &listed {
            Some(set) => Ok(set.contains(&key)),
            None => backend.exists(&key),
        }
    });
    let mut todo = Vec::new();
    let mut present = Vec::new();
    for (n, has) in nodes.iter().zip(have) {
        if has? {
            t.present += 1;
            present.push(n);
        } else {
            todo.push(n);
        }
    }
    if remote.signer.is_some() {
        countersign(remote, &present, &mut t);
    }
    // Each object once, whichever nodes share it.
    let mut uploads: Vec<Upload> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut broken: BTreeMap<String, String> = BTreeMap::new();
    // Objects this push does not put on the remote (damaged here, or their
    // upload failed): no record naming one is pushed.
    let mut not_sent: BTreeSet<String> = BTreeSet::new();
    for n in &todo {
        for o in &n.outputs {
            if !o.stored() {
                // A record is pushed only with all its objects; this one is gone on purpose.
                not_sent.insert(o.object.hash.clone());
                broken.insert(
                    n.node_id.clone(),
                    format!(
                        "output '{}' was {} (`orchestrate run --force {}` makes it again)",
                        o.name,
                        o.dropped.as_deref().unwrap_or("dropped"),
                        n.node_id
                    ),
                );
                continue;
            }
            if !seen.insert(o.object.hash.clone()) {
                continue;
            }
            let path = ws.object_path(&o.object.hash);
            // The local object must still hash to its name before it is sent.
            let checked = match o.object.kind {
                OutputKind::File => crate::store::hash_file(&path).map(|(h, _)| (h, None)),
                OutputKind::Dir => dir_listing(&path)
                    .map(|(files, bytes)| (blake3::hash(&bytes).to_hex().to_string(), Some((files, bytes)))),
            };
            let listing = match checked {
                Ok((h, listing)) if h == o.object.hash => listing,
                other => {
                    let why = match other {
                        Ok(_) => format!("local object {} of output '{}' is damaged", o.object.hash, o.name),
                        Err(e) => format!("output '{}': {e}", o.name),
                    };
                    not_sent.insert(o.object.hash.clone());
                    broken.insert(n.node_id.clone(), why);
                    continue;
                }
            };
            progress.grow(o.object.size);
            uploads.push(Upload { node: n.node_id.clone(), hash: o.object.hash.clone(), path, listing });
        }
    }
    let sent_objects = AtomicUsize::new(0);
    let objects_there =
        known_keys(remote, "objects/", uploads.iter().map(|u| 1 + u.listing.as_ref().map_or(0, |l| l.0.len())).sum())?;
    let results = parallel(&uploads, remote.jobs, |u| -> Result<(), String> {
        let fail = |e: RemoteError| format!("node '{}', object {}: {e}", u.node, u.hash);
        // Known there, or asked (a HEAD) unless small enough that sending it
        // again costs what asking does.
        let there = |key: &str, size: u64| -> Result<bool, String> {
            match &objects_there {
                Some(set) => Ok(set.contains(key)),
                None if size <= SMALL_OBJECT => Ok(false),
                None => backend.exists(key).map_err(fail),
            }
        };
        let send = |key: &str, path: &Path, size: u64| -> Result<(), String> {
            if there(key, size)? {
                progress.add(size);
                return Ok(());
            }
            backend.put_file(key, path, &|n| progress.add(n)).map_err(fail)?;
            sent_objects.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        match &u.listing {
            None => {
                // An object that cannot be read is an error here, not a size of 0.
                let size = std::fs::metadata(&u.path).map_err(|e| format!("reading {}: {e}", u.path.display()))?.len();
                send(&object_key(&u.hash), &u.path, size)
            }
            Some((files, bytes)) => {
                for (rel, h, size) in files {
                    send(&object_key(h), &u.path.join(rel), *size)?;
                }
                // The listing last: a listing on the remote has its files.
                let key = object_key(&u.hash);
                if !there(&key, bytes.len() as u64)? {
                    backend.put_bytes(&key, bytes).map_err(fail)?;
                    sent_objects.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
        }
    });
    for (u, r) in uploads.iter().zip(results) {
        if let Err(e) = r {
            not_sent.insert(u.hash.clone());
            t.failed.push(e);
        }
    }
    // Records, only of nodes all of whose objects are on the remote.
    let ready: Vec<&CachedNode> = todo
        .into_iter()
        .filter(|n| !broken.contains_key(&n.node_id) && n.outputs.iter().all(|o| !not_sent.contains(&o.object.hash)))
        .collect();
    let sent = parallel(&ready, remote.jobs, |n| {
        let node = portable(n);
        let signatures = remote.signer.iter().map(|k| sign(&node, k)).collect();
        let bytes = serde_json::to_vec_pretty(&RemoteRecord { node, signatures }).expect("a record serializes");
        backend.put_bytes(&record_key(&n.key), &bytes).map_err(|e| format!("record of node '{}': {e}", n.node_id))
    });
    for r in sent {
        match r {
            Ok(()) => t.nodes += 1,
            Err(e) => t.failed.push(e),
        }
    }
    for (node, why) in broken {
        t.failed.push(format!("node '{node}': {why}; not pushed"));
    }
    t.objects = sent_objects.into_inner();
    t.bytes = progress.bytes.load(Ordering::Relaxed);
    progress.finish();
    Ok(t)
}

/// Adds this push's signature to records the remote already has whose
/// outputs are the ones made here (a second person who reproduced a result
/// vouches for it too). A record whose outputs differ from ours is not
/// signed, and said: one of the two runs did not reproduce the other. Two
/// people counter-signing one record at the same moment can lose one of the
/// two signatures (the last write wins); pushing again adds it back.
fn countersign(remote: &Remote, present: &[&CachedNode], t: &mut Transfer) {
    let Some(signer) = &remote.signer else { return };
    let results = parallel(present, remote.jobs, |n| -> Result<bool, String> {
        let what = format!("node '{}'", n.node_id);
        let mut bytes = Vec::new();
        if remote
            .backend
            .get(&record_key(&n.key), MAX_RECORD_BYTES, &mut bytes)
            .map_err(|e| format!("{what}: {e}"))?
            .is_none()
        {
            return Ok(false);
        }
        let mut theirs: RemoteRecord =
            serde_json::from_slice(&bytes).map_err(|e| format!("{what}: the remote's record does not read: {e}"))?;
        if theirs.signatures.iter().any(|s| s.key == signer.name) {
            return Ok(false);
        }
        let ours = portable(n);
        if signed_payload(&theirs.node) != signed_payload(&ours) {
            return Err(format!(
                "{what}: the remote's record names other outputs than the ones made here ({}); not counter-signed \
                 (`orchestrate run --check` re-executes it)",
                differing_output(&theirs.node, &ours)
            ));
        }
        // Our own record goes back up (the signatures cover the same payload),
        // never bytes from the remote that nothing here checked.
        theirs.signatures.push(sign(&ours, signer));
        let record = RemoteRecord { node: ours, signatures: theirs.signatures };
        let bytes = serde_json::to_vec_pretty(&record).expect("a record serializes");
        remote.backend.put_bytes(&record_key(&n.key), &bytes).map_err(|e| format!("{what}: {e}"))?;
        Ok(true)
    });
    for r in results {
        match r {
            Ok(signed) => t.countersigned += usize::from(signed),
            Err(e) => t.failed.push(e),
        }
    }
}

/// The first output whose object differs between two records of one key.
fn differing_output(a: &CachedNode, b: &CachedNode) -> String {
    for o in &a.outputs {
        match b.outputs.iter().find(|p| p.name == o.name) {
            Some(p) if p.object == o.object && p.workspace_path == o.workspace_path => {}
            Some(p) => {
                return format!(
                    "output '{}': {} ({} bytes) vs {} ({} bytes)",
                    o.name, o.object.hash, o.object.size, p.object.hash, p.object.size
                )
            }
            None => return format!("output '{}' only on one side", o.name),
        }
    }
    match b.outputs.iter().find(|p| !a.outputs.iter().any(|o| o.name == p.name)) {
        Some(p) => format!("output '{}' only on one side", p.name),
        None => "the same outputs".into(),
    }
}

/// An object this small is sent without asking first whether it is there.
const SMALL_OBJECT: u64 = 256 << 10;

/// The keys under a prefix when listing them costs less than asking for
/// `queries` keys one by one (a list page holds 1,000 keys; one page is
/// weighed as 200 HEAD requests); `None` for few queries or a large remote.
fn known_keys(remote: &Remote, prefix: &str, queries: usize) -> Result<Option<BTreeSet<String>>, RemoteError> {
    if queries < 64 {
        return Ok(None);
    }
    Ok(remote.backend.list(prefix, queries / 200 + 1)?.map(|keys| keys.into_iter().collect()))
}

/// A relative path inside a folder: no root, no `..` or `.`, no empty part.
fn safe_relative(rel: &str) -> bool {
    !rel.is_empty()
        && !rel.contains('\0')
        && Path::new(rel).components().all(|c| matches!(c, Component::Normal(_)))
        && !rel.starts_with('/')
        && !rel.split('/').any(|p| p.is_empty() || p == "." || p == "..")
}

/// Reads and checks a record from the remote: bounded, typed, stored under
/// the key it holds, naming only well-formed hashes, sizes within bounds and
/// paths that stay inside their folder.
/// Last, the remote's trust policy: a record without a signature by a
/// trusted key is refused where one is required, and one whose trusted
/// signature does not verify is always refused.
pub fn read_record(remote: &Remote, key: &Key) -> Result<Option<(CachedNode, Verified)>, RemoteError> {
    let mut bytes = Vec::new();
    let what = format!("record {} on {}", key.short(), remote.url);
    if remote.backend.get(&record_key(key), MAX_RECORD_BYTES, &mut bytes)?.is_none() {
        return Ok(None);
    }
    let RemoteRecord { node, signatures } =
        serde_json::from_slice(&bytes).map_err(|e| RemoteError::Refused(format!("{what}: not a node record: {e}")))?;
    if node.key != *key {
        return Err(RemoteError::Refused(format!(
            "{what}: it holds key {}, not the one it is stored under",
            node.key.short()
        )));
    }
    // The key is recomputed from the record's own hash inputs: a record whose
    // params (or inputs, files, environment) were edited no longer names it.
    let recomputed = node.record.key();
    if recomputed != *key {
        return Err(RemoteError::Refused(format!(
            "{what} (node '{}'): its hash inputs give key {}, not {}: the record was altered",
            crate::ids::escaped(&node.node_id),
            recomputed.short(),
            key.short()
        )));
    }
    let max = max_object_bytes();
    let mut names = BTreeSet::new();
    for o in &node.outputs {
        let bad =
            |why: String| RemoteError::Refused(format!("{what} (node '{}'), output '{}': {why}", node.node_id, o.name));
        if !is_hex64(&o.object.hash) {
            return Err(bad(format!("'{}' is not a content hash", o.object.hash)));
        }
        if o.object.size > max {
            return Err(bad(format!(
                "declares {} bytes, over the limit of {max} (ORCHESTRATE_REMOTE_MAX_BYTES)",
                o.object.size
            )));
        }
        if o.object.files > MAX_DIR_FILES || (o.object.kind == OutputKind::File && o.object.files != 1) {
            return Err(bad(format!("declares {} files", o.object.files)));
        }
        if !names.insert(o.name.clone()) {
            return Err(bad("listed twice".into()));
        }
        if let Some(rel) = &o.workspace_path {
            if !safe_relative(rel) {
                return Err(bad(format!("its path '{rel}' leaves the spec's folder")));
            }
        }
    }
    let verified = remote.trust.check(&node, &signatures).map_err(|why| {
        RemoteError::Refused(format!("{what} (node '{}'): {why}", crate::ids::escaped(&node.node_id)))
    })?;
    Ok(Some((node, verified)))
}

/// A writer that hashes what it writes.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Downloads one file object to `to`, checking its size and hash.
fn fetch_file(
    remote: &Remote,
    hash: &str,
    size: u64,
    to: &Path,
    what: &str,
    progress: &Progress,
) -> Result<(), RemoteError> {
    let file =
        std::fs::File::create(to).map_err(|e| RemoteError::Transfer(format!("creating {}: {e}", to.display())))?;
    let mut w = Hashing { inner: std::io::BufWriter::new(file), hasher: blake3::Hasher::new() };
    let got = remote.backend.get(&object_key(hash), size, &mut w).map_err(|e| match e {
        RemoteError::Refused(m) => RemoteError::Refused(format!("{what}: {m}; refused")),
        RemoteError::Transfer(m) => RemoteError::Transfer(format!("{what}: {m}")),
        other => other,
    })?;
    w.flush().map_err(|e| RemoteError::Transfer(format!("writing {}: {e}", to.display())))?;
    let Some(n) = got else {
        return Err(RemoteError::Refused(format!("{what}: object {hash} is missing from the remote")));
    };
    progress.add(n);
    let actual = w.hasher.finalize().to_hex().to_string();
    if n != size || actual != hash {
        return Err(RemoteError::Refused(format!(
            "{what}: the remote served {n} bytes hashing to {actual} for object {hash} ({size} bytes); refused"
        )));
    }
    Ok(())
}

/// Fetches one output's object into the local store (unless present),
/// checking every byte against the record before it is published.
fn fetch_object(
    ws: &Workspace,
    remote: &Remote,
    node: &CachedNode,
    o: &OutputRecord,
    progress: &Progress,
) -> Result<u64, RemoteError> {
    if ws.has_object(&o.object) {
        return Ok(0);
    }
    let what = format!("node '{}', output '{}'", node.node_id, o.name);
    let staging = ws.staging()?;
    let staged = staging.path().join("object");
    match o.object.kind {
        OutputKind::File => fetch_file(remote, &o.object.hash, o.object.size, &staged, &what, progress)?,
        OutputKind::Dir => {
            let mut listing = Vec::new();
            if remote.backend.get(&object_key(&o.object.hash), MAX_LISTING_BYTES, &mut listing)?.is_none() {
                return Err(RemoteError::Refused(format!(
                    "{what}: folder object {} is missing from the remote",
                    o.object.hash
                )));
            }
            if blake3::hash(&listing).to_hex().as_str() != o.object.hash {
                return Err(RemoteError::Refused(format!(
                    "{what}: the listing of folder {} does not hash to its name; refused",
                    o.object.hash
                )));
            }
            let files = parse_listing(&listing)
                .map_err(|why| RemoteError::Refused(format!("{what}: folder {}: {why}", o.object.hash)))?;
            let total: u64 = files.iter().map(|f| f.2).sum();
            if total != o.object.size || files.len() as u64 != o.object.files {
                return Err(RemoteError::Refused(format!(
                    "{what}: folder {} lists {} files, {total} bytes; the record says {} files, {} bytes",
                    o.object.hash,
                    files.len(),
                    o.object.files,
                    o.object.size
                )));
            }
            std::fs::create_dir_all(&staged)
                .map_err(|e| RemoteError::Transfer(format!("{}: {e}", staged.display())))?;
            for (rel, hash, size) in &files {
                let to = staged.join(rel);
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| RemoteError::Transfer(format!("{}: {e}", parent.display())))?;
                }
                fetch_file(remote, hash, *size, &to, &format!("{what}, file '{rel}'"), progress)?;
            }
        }
    }
    let info = ws.publish_move(&staged, o.object.kind)?;
    if info.hash != o.object.hash {
        return Err(RemoteError::Refused(format!(
            "{what}: the fetched object hashes to {}, not {}; refused",
            info.hash, o.object.hash
        )));
    }
    Ok(1)
}

/// Parses a folder listing (its header is checked by the hash already).
fn parse_listing(bytes: &[u8]) -> Result<Vec<ListedFile>, String> {
    let body = bytes.strip_prefix(DIR_LISTING_HEADER).ok_or("not a folder listing")?;
    let text = std::str::from_utf8(body).map_err(|_| "not UTF-8")?;
    let mut out = Vec::new();
    for line in text.split_terminator('\n') {
        let mut parts = line.split('\0');
        let (Some(rel), Some(hash), Some(size), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(format!("malformed entry {line:?}"));
        };
        if !safe_relative(rel) {
            return Err(format!("path '{rel}' leaves the folder"));
        }
        if !is_hex64(hash) {
            return Err(format!("'{hash}' is not a content hash"));
        }
        let size: u64 = size.parse().map_err(|_| format!("size '{size}'"))?;
        out.push((rel.to_string(), hash.to_string(), size));
        if out.len() as u64 > MAX_DIR_FILES {
            return Err(format!("more than {MAX_DIR_FILES} files"));
        }
    }
    Ok(out)
}

/// A node of the spec being run here, as a record fetched for it must match.
#[derive(Debug, Clone, Copy)]
pub struct LocalNode<'a> {
    /// Its id in this spec (the record is kept under it).
    pub id: &'a str,
    /// This spec's name.
    pub spec: &'a str,
    /// The outputs it declares: a record must list exactly these, in order,
    /// each going where it declares in the tree.
    pub outputs: &'a [crate::ops::OutputDecl],
}

impl LocalNode<'_> {
    /// Refuses a record whose outputs are not the ones this node declares.
    /// The key covers what a node read, not where its outputs go, so without
    /// this a record could have `pull` write a node's bytes anywhere in the
    /// spec's folder where no file is yet (a git hook, a `sitecustomize.py`).
    fn check_outputs(&self, node: &CachedNode, what: &str) -> Result<(), RemoteError> {
        let listed: Vec<&str> = node.outputs.iter().map(|o| o.name.as_str()).collect();
        let declared: Vec<&str> = self.outputs.iter().map(|o| o.name.as_str()).collect();
        if listed != declared {
            return Err(RemoteError::Refused(format!(
                "{what}: it lists the outputs [{}], but node '{}' declares [{}]; refused",
                listed.join(", "),
                self.id,
                declared.join(", ")
            )));
        }
        for (o, d) in node.outputs.iter().zip(self.outputs) {
            if o.workspace_path != d.workspace_path {
                let at = |p: &Option<String>| p.as_deref().map_or("the store only".to_string(), |p| format!("'{p}'"));
                return Err(RemoteError::Refused(format!(
                    "{what}: output '{}' goes to {} in the tree, but node '{}' declares it at {}; refused",
                    o.name,
                    at(&o.workspace_path),
                    self.id,
                    at(&d.workspace_path)
                )));
            }
        }
        Ok(())
    }
}

/// Fetches a node by key: its record, then every object it names, then the
/// record is committed locally (and outputs that live in the user's tree are
/// written there when missing). `None` when the remote does not have it.
/// The node is recorded locally under this workspace's node id and spec name
/// (a key does not depend on them: a renamed node shares its cache).
pub fn fetch_node(
    ws: &Workspace,
    index: &Index,
    remote: &Remote,
    key: &Key,
    local: LocalNode<'_>,
    spec_dir: &Path,
    progress: &Progress,
) -> Result<Option<(CachedNode, Verified)>, RemoteError> {
    let Some((mut node, verified)) = read_record(remote, key)? else { return Ok(None) };
    local.check_outputs(&node, &format!("record {} on {}", key.short(), remote.url))?;
    (node.node_id, node.spec) = (local.id.to_string(), local.spec.to_string());
    for o in &node.outputs {
        fetch_object(ws, remote, &node, o, progress)?;
    }
    Ok(Some((land(ws, index, spec_dir, node)?, verified)))
}

/// Commits a node whose objects are all in the store, checks its outputs out
/// into the user's tree, and returns it as the index now holds it.
fn land(ws: &Workspace, index: &Index, spec_dir: &Path, node: CachedNode) -> Result<CachedNode, RemoteError> {
    ws.commit_node(index, &node)?;
    checkout(ws, index, spec_dir, &node)?;
    Ok(index.lookup(&node.key)?.unwrap_or(node))
}

/// Writes outputs that live in the user's tree (a shell node's `outs`, files
/// and folders) there when they are missing, as `dvc pull` checks them out,
/// by the store's own checkout (cache types, no write through a link); an
/// existing file or folder is left alone.
fn checkout(ws: &Workspace, index: &Index, spec_dir: &Path, node: &CachedNode) -> Result<(), RemoteError> {
    let _outs = ws.lock_outs(spec_dir, node.tree_outs(), |_| {}, &|| false)?;
    ws.restore_outputs(index, node, spec_dir, crate::store::Replace::Missing)?;
    Ok(())
}

/// Fetches several nodes by key in parallel (records and objects), then
/// commits each whose objects all arrived. Returns per key: fetched, absent,
/// or why it was refused.
pub fn pull(
    ws: &Workspace,
    index: &Index,
    remote: &Remote,
    keys: &[(LocalNode<'_>, Key)],
    spec_dir: &Path,
    progress: &Progress,
) -> Result<(Transfer, BTreeMap<String, CachedNode>), RemoteError> {
    let mut t = Transfer::default();
    let records = parallel(keys, remote.jobs, |(_, k)| read_record(remote, k));
    let mut found: Vec<CachedNode> = Vec::new();
    for ((local, key), r) in keys.iter().zip(records) {
        let id = local.id;
        let checked = r.and_then(|r| match r {
            Some((n, verified)) => {
                local.check_outputs(&n, &format!("record {} on {}", key.short(), remote.url))?;
                Ok(Some((n, verified)))
            }
            None => Ok(None),
        });
        match checked {
            Ok(Some((mut n, verified))) => {
                if let Some(why) = remote.trust.flagged(&verified) {
                    t.unverified.push(format!("{id}: {why}"));
                }
                progress.grow(n.outputs.iter().map(|o| o.object.size).sum());
                (n.node_id, n.spec) = (id.to_string(), local.spec.to_string());
                found.push(n);
            }
            Ok(None) => t.missing.push(id.to_string()),
            Err(e) => t.failed.push(format!("node '{id}': {e}")),
        }
    }
    let fetched = parallel(&found, remote.jobs, |n| -> Result<usize, RemoteError> {
        let mut k = 0;
        for o in &n.outputs {
            k += fetch_object(ws, remote, n, o, progress)? as usize;
        }
        Ok(k)
    });
    let mut done = BTreeMap::new();
    for (n, r) in found.into_iter().zip(fetched) {
        match r {
            Ok(k) => {
                t.objects += k;
                t.nodes += 1;
                done.insert(n.node_id.clone(), land(ws, index, spec_dir, n)?);
            }
            Err(e) => t.failed.push(e.to_string()),
        }
    }
    t.bytes = progress.bytes.load(Ordering::Relaxed);
    Ok((t, done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_paths_that_leave_the_folder_are_refused() {
        let h = "a".repeat(64);
        let ok = [DIR_LISTING_HEADER, format!("sub/f.bin\0{h}\0{}\n", 3).as_bytes()].concat();
        assert_eq!(parse_listing(&ok).unwrap(), [("sub/f.bin".to_string(), h.clone(), 3)]);
        for bad in ["../x", "/etc/passwd", "a//b", "./a", "a/../../b", ""] {
            let l = [DIR_LISTING_HEADER, format!("{bad}\0{h}\0{}\n", 3).as_bytes()].concat();
            assert!(parse_listing(&l).is_err(), "{bad:?}");
        }
        let l = [DIR_LISTING_HEADER, format!("f\0../../{}\0{}\n", "a".repeat(58), 3).as_bytes()].concat();
        assert!(parse_listing(&l).is_err());
    }
}
