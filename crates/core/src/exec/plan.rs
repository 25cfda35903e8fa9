//! `plan` and `explain`: what a run would do and why, without changing anything.

use crate::store::Key;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::node::{decide, hash_inputs, Decision};
use super::EnvProvider;
use crate::dag::key::{diff, Change, HashInputs};
use crate::dag::Dag;
use crate::spec::Spec;
use crate::store::{Index, OutputRecord, Replace, StoreError, Workspace};

/// What a run would do with one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PlanState {
    Cached {
        key: Key,
    },
    /// Not in the local cache, but the remote has it: a run with `--remote`
    /// fetches it instead of running it.
    CachedRemote {
        key: Key,
        remote: String,
    },
    /// Cached, but its outputs in the user's tree are missing or differ: a
    /// run checks them out of the store instead of running the node.
    Restore {
        key: Key,
        reason: String,
    },
    /// Will run; `key` is known when every input is.
    Run {
        key: Option<Key>,
        reason: String,
    },
    /// Runs only if the listed upstream nodes, which will run, produce different bytes.
    Pending {
        after: Vec<String>,
    },
    /// Cannot be resolved as things stand (e.g. a missing dep file).
    Error {
        error: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanEntry {
    pub node: String,
    #[serde(flatten)]
    pub state: PlanState,
}

struct Ctx<'a> {
    ws: Option<&'a Workspace>,
    remote: Option<&'a crate::remote::Remote>,
    index: Option<Index>,
    env: Option<Result<crate::dag::key::EnvPart, String>>,
    provider: &'a EnvProvider,
}

impl Ctx<'_> {
    fn env(&mut self) -> Result<crate::dag::key::EnvPart, String> {
        let provider = self.provider;
        self.env.get_or_insert_with(provider).clone()
    }
}

/// The plan of a run: one entry per node, in a topological order.
pub fn plan(
    ws: Option<&Workspace>,
    spec: &Spec,
    dag: &Dag,
    force: &BTreeSet<String>,
    env: &EnvProvider,
) -> Result<Vec<PlanEntry>, StoreError> {
    plan_with_remote(ws, spec, dag, force, env, None)
}

/// The plan of a run with `--remote`: a node the local cache lacks but the
/// remote has is `cached_remote` (its record, read from the remote, gives
/// the outputs its downstream nodes' keys are computed from).
pub fn plan_with_remote(
    ws: Option<&Workspace>,
    spec: &Spec,
    dag: &Dag,
    force: &BTreeSet<String>,
    env: &EnvProvider,
    remote: Option<&crate::remote::Remote>,
) -> Result<Vec<PlanEntry>, StoreError> {
    let index = ws.map(Workspace::index).transpose()?;
    // The whole plan reads one snapshot of the index (one shared lock, not
    // one per read); not while it also asks a remote, which can be slow.
    if let (Some(index), None) = (&index, remote) {
        index.batch_reads()?;
    }
    let mut ctx = Ctx { ws, remote, index, env: None, provider: env };
    let mut known: BTreeMap<String, Vec<OutputRecord>> = BTreeMap::new();
    let mut runs: BTreeSet<String> = BTreeSet::new();
    let mut entries = Vec::with_capacity(dag.nodes.len());
    for &pos in &dag.order {
        let node = &dag.nodes[pos];
        let id = node.id().to_string();
        let parents: Vec<String> = dag.parents(pos).iter().map(|&p| dag.nodes[p].id().to_string()).collect();
        let state = if parents.iter().any(|p| !known.contains_key(p) && !runs.contains(p)) {
            PlanState::Error { error: "an upstream node cannot be resolved".into() }
        } else {
            let unknown: Vec<String> = parents.iter().filter(|p| runs.contains(*p)).cloned().collect();
            let (state, outputs) = state_of(&mut ctx, spec, dag, pos, &known, &unknown, force.contains(&id))?;
            if let Some(outputs) = outputs {
                known.insert(id.clone(), outputs);
            }
            state
        };
        let state = match (state, ctx.remote, force.contains(&id)) {
            (PlanState::Run { key: Some(key), reason }, Some(remote), false) => {
                match crate::remote::read_record(remote, &key) {
                    Ok(Some((node, _))) => {
                        known.insert(id.clone(), node.outputs);
                        PlanState::CachedRemote { key, remote: remote.url.to_string() }
                    }
                    Ok(None) => PlanState::Run { key: Some(key), reason },
                    Err(e) => PlanState::Run { key: Some(key), reason: format!("{reason}; the remote's copy: {e}") },
                }
            }
            (state, _, _) => state,
        };
        if let PlanState::Run { .. } | PlanState::Pending { .. } = &state {
            runs.insert(id.clone());
        }
        entries.push(PlanEntry { node: id, state });
    }
    if let Some(index) = &ctx.index {
        index.end_reads()?;
    }
    Ok(entries)
}

/// A node's plan state, with a cached node's outputs (a hit's as checked, a
/// restore's as recorded), so they are not looked up a second time.
fn state_of(
    ctx: &mut Ctx<'_>,
    spec: &Spec,
    dag: &Dag,
    pos: usize,
    known: &BTreeMap<String, Vec<OutputRecord>>,
    unknown_parents: &[String],
    forced: bool,
) -> Result<(PlanState, Option<Vec<OutputRecord>>), StoreError> {
    let node = &dag.nodes[pos];
    if ctx.ws.is_none() {
        return Ok(undecided(PlanState::Run {
            key: None,
            reason: if forced { "forced".into() } else { "new node (no workspace yet)".into() },
        }));
    }
    let env = if node.op.numerical() {
        match ctx.env() {
            Ok(e) => Some(super::slurm::node_env(spec.executor, &node.def, &e)),
            Err(e) => {
                return Ok(undecided(PlanState::Error {
                    error: format!("cannot determine the numerical environment: {e}"),
                }))
            }
        }
    } else {
        None
    };
    let (Some(ws), Some(index)) = (ctx.ws, ctx.index.as_ref()) else {
        return Ok(undecided(PlanState::Error { error: "the workspace index is not open".into() }));
    };
    if !unknown_parents.is_empty() {
        // Inputs are not known yet; the node's own fields may already force a run.
        let Some(last) = index.latest_for_node(node.id(), spec.spec_ref())? else {
            return Ok(undecided(PlanState::Run { key: None, reason: "new node".into() }));
        };
        let mut upstream = known.clone();
        for p in unknown_parents {
            upstream.insert(p.clone(), Vec::new());
        }
        let last_record = last.record.clone();
        let mut partial = last_record.clone();
        if let Ok(own) = own_fields(ws, index, node, spec, env) {
            partial.op = own.op;
            partial.op_version = own.op_version;
            partial.params = own.params;
            partial.files = own.files;
            partial.trees = own.trees;
            partial.params_files = own.params_files;
            partial.env = own.env;
        }
        let changes = diff(&last_record, &partial);
        if forced {
            return Ok(undecided(PlanState::Run { key: None, reason: "forced".into() }));
        }
        if !changes.is_empty() {
            let reason = crate::dag::key::describe(&changes);
            return Ok(undecided(PlanState::Run { key: None, reason }));
        }
        return Ok(undecided(PlanState::Pending { after: unknown_parents.to_vec() }));
    }
    let record = match hash_inputs(ws, index, node, &spec.base_dir, known, env) {
        Ok(r) => r,
        Err(e) => return Ok(undecided(PlanState::Error { error: e.to_string() })),
    };
    let key = record.key();
    Ok(match decide(ws, index, &spec.base_dir, spec.spec_ref(), node.id(), &record, &key, forced)? {
        Decision::Hit(outputs) => (PlanState::Cached { key }, Some(outputs)),
        Decision::Restore(cached, why) => (PlanState::Restore { key, reason: why }, Some(cached.outputs)),
        Decision::Run(reason) => undecided(PlanState::Run { key: Some(key), reason: reason.to_string() }),
    })
}

/// A state that brings no outputs: the node runs, waits or cannot be resolved.
fn undecided(state: PlanState) -> (PlanState, Option<Vec<OutputRecord>>) {
    (state, None)
}

/// The node's record with inputs left empty: what it depends on besides upstream bytes.
fn own_fields(
    ws: &Workspace,
    index: &Index,
    node: &crate::dag::DagNode,
    spec: &Spec,
    env: Option<crate::dag::key::EnvPart>,
) -> Result<HashInputs, crate::exec::node::RecordError> {
    let mut bare = node.clone();
    bare.inputs.clear();
    hash_inputs(ws, index, &bare, &spec.base_dir, &BTreeMap::new(), env)
}

/// The hash-input diff of one node between its last cached record and now.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub node: String,
    /// The key it would have now, when all its inputs are known.
    pub key: Option<Key>,
    pub cached_key: Option<Key>,
    pub cached_at: Option<String>,
    pub changes: Vec<Change>,
    /// The current record (the last known outputs stand in for upstream nodes that would re-run).
    pub record: Option<HashInputs>,
    pub notes: Vec<String>,
}

/// Explains one node: its current hash inputs against the last cached ones.
pub fn explain(
    ws: Option<&Workspace>,
    spec: &Spec,
    dag: &Dag,
    node_id: &str,
    env: &EnvProvider,
) -> Result<Explanation, StoreError> {
    let pos = dag.position(node_id).expect("caller checked the node exists");
    let node = &dag.nodes[pos];
    let mut out = Explanation {
        node: node_id.to_string(),
        key: None,
        cached_key: None,
        cached_at: None,
        changes: Vec::new(),
        record: None,
        notes: Vec::new(),
    };
    let Some(ws) = ws else {
        out.notes.push("no workspace yet: nothing has been cached".into());
        return Ok(out);
    };
    let index = ws.index()?;
    let mut upstream = BTreeMap::new();
    let mut stand_in = false;
    for p in dag.parents(pos) {
        let pid = dag.nodes[p].id();
        match index.latest_for_node(pid, spec.spec_ref())? {
            Some(c) => {
                upstream.insert(pid.to_string(), c.outputs);
            }
            None => {
                out.notes.push(format!("upstream '{pid}' has never completed, so this node's inputs are unknown"));
                stand_in = true;
            }
        }
    }
    let env = if node.op.numerical() {
        Some(super::slurm::node_env(spec.executor, &node.def, &env().map_err(StoreError::Invalid)?))
    } else {
        None
    };
    let last = index.latest_for_node(node_id, spec.spec_ref())?;
    if let Some(l) = &last {
        out.cached_key = Some(l.key.clone());
        out.cached_at = Some(l.finished_at.clone());
    } else {
        out.notes.push("this node has never completed".into());
    }
    if stand_in {
        return Ok(out);
    }
    match hash_inputs(ws, &index, node, &spec.base_dir, &upstream, env) {
        Ok(record) => {
            out.key = Some(record.key());
            if let Some(l) = &last {
                out.changes = diff(&l.record, &record);
            }
            out.record = Some(record);
        }
        Err(e) => out.notes.push(e.to_string()),
    }
    Ok(out)
}

/// A node a run must run again because `gc --drop-states` dropped an output
/// that a node which will run reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Regenerate {
    pub node: String,
    pub output: String,
    /// The node that reads it.
    pub reader: String,
}

/// Which cached nodes a run with `force` must run again to make a dropped
/// output (a training state `gc --drop-states` removed) for a node that will
/// run and reads it; transitively (a node run again may itself read a dropped
/// state). Empty, at the cost of one query, when nothing was dropped.
pub fn dropped_needed(
    ws: Option<&Workspace>,
    spec: &Spec,
    dag: &Dag,
    force: &BTreeSet<String>,
    env: &EnvProvider,
) -> Result<Vec<Regenerate>, StoreError> {
    let Some(ws) = ws else { return Ok(Vec::new()) };
    if !ws.with_index(Index::any_dropped)? {
        return Ok(Vec::new());
    }
    // Planning here only looks: the command's own checks of the cache come after.
    let ws = &ws.read_only_view();
    let index = ws.index()?;
    let entries = plan(Some(ws), spec, dag, force, env)?;
    let state: BTreeMap<&str, &PlanState> = entries.iter().map(|e| (e.node.as_str(), &e.state)).collect();
    // Nodes that will (or may) run; grown by each node found to need running again.
    let mut runs: BTreeSet<String> = entries
        .iter()
        .filter(|e| matches!(e.state, PlanState::Run { .. } | PlanState::Pending { .. } | PlanState::Error { .. }))
        .map(|e| e.node.clone())
        .collect();
    let mut out = Vec::new();
    // Readers before what they read: reverse topological order, so a node
    // added here has its own inputs looked at after it.
    for &pos in dag.order.iter().rev() {
        let node = &dag.nodes[pos];
        if !runs.contains(node.id()) {
            continue;
        }
        for refs in node.inputs.values() {
            for r in refs {
                let Some(PlanState::Cached { key } | PlanState::Restore { key, .. }) = state.get(r.node.as_str())
                else {
                    continue;
                };
                let Some(cached) = index.lookup(key)? else { continue };
                let dropped = cached.outputs.iter().any(|o| o.name == r.output && !o.stored());
                if dropped && runs.insert(r.node.clone()) {
                    out.push(Regenerate {
                        node: r.node.clone(),
                        output: r.output.clone(),
                        reader: node.id().to_string(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// What `orchestrate checkout` did with one node.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CheckedOut {
    /// Its outs in the tree already match its cached outputs.
    UpToDate { node: String, key: Key },
    /// Its outs were checked out of the store; `moved`: outs replaced
    /// (`--force`) whose bytes the store lacked, moved into the trash.
    Restored {
        node: String,
        key: Key,
        files: u64,
        bytes: u64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        moved: Vec<crate::store::MovedOut>,
    },
    /// Outs whose bytes in the tree the store does not hold were left as
    /// they are (`--force` replaces them); any others were checked out.
    Kept { node: String, key: Key, outs: Vec<crate::store::KeptOut>, files: u64, bytes: u64 },
    /// Its key is not in the store (or its objects are not): it must run.
    Missing { node: String, reason: String },
    /// A node it reads is missing, so its key cannot be known.
    Below { node: String, missing: String },
}

/// `orchestrate checkout SPEC [NODE...]` (`dvc checkout`): for each node in
/// order, the key it has now; when that key is cached and its objects are
/// present, its outs in the tree are made to match it (checked out of the
/// store where missing or different). An out holding bytes the store does
/// not have (an edit by hand) is kept unless `force`. Nothing runs.
pub fn checkout(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    env: &EnvProvider,
    force: bool,
) -> Result<Vec<CheckedOut>, crate::store::StoreError> {
    super::refuse_outs_over_workspace(ws, spec, dag)?;
    let index = ws.index()?;
    let mut known: BTreeMap<String, Vec<OutputRecord>> = BTreeMap::new();
    let mut missing_root: BTreeMap<usize, String> = BTreeMap::new();
    let mut env_part: Option<Result<crate::dag::key::EnvPart, String>> = None;
    let mut out = Vec::new();
    for &pos in &dag.order {
        let node = &dag.nodes[pos];
        let id = node.id().to_string();
        if let Some(root) = dag.parents(pos).iter().find_map(|q| missing_root.get(q)).cloned() {
            missing_root.insert(pos, root.clone());
            out.push(CheckedOut::Below { node: id, missing: root });
            continue;
        }
        let part = if node.op.numerical() {
            match env_part.get_or_insert_with(env) {
                Ok(e) => Some(super::slurm::node_env(spec.executor, &node.def, e)),
                Err(e) => {
                    missing_root.insert(pos, id.clone());
                    out.push(CheckedOut::Missing { node: id, reason: format!("no numerical environment: {e}") });
                    continue;
                }
            }
        } else {
            None
        };
        let record = match hash_inputs(ws, &index, node, &spec.base_dir, &known, part) {
            Ok(r) => r,
            Err(reason) => {
                missing_root.insert(pos, id.clone());
                out.push(CheckedOut::Missing { node: id, reason: reason.to_string() });
                continue;
            }
        };
        let key = record.key();
        match decide(ws, &index, &spec.base_dir, spec.spec_ref(), &id, &record, &key, false)? {
            Decision::Hit(outputs) => {
                known.insert(id.clone(), outputs);
                out.push(CheckedOut::UpToDate { node: id, key });
            }
            Decision::Restore(cached, _) => {
                let _lock = ws.lock_node(&cached.key, || {})?;
                let _outs = ws.lock_outs(&spec.base_dir, node.tree_outs(), |_| {}, &|| false)?;
                let replace = if force { Replace::All } else { Replace::Stored };
                let r = match ws.restore_outputs(&index, &cached, &spec.base_dir, replace) {
                    Ok(r) => r,
                    // Its object was damaged: moved aside, never placed; the node is to run again.
                    Err(e @ StoreError::DamagedObject { .. }) => {
                        missing_root.insert(pos, id.clone());
                        out.push(CheckedOut::Missing { node: id, reason: e.to_string() });
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                known.insert(id.clone(), r.outputs);
                out.push(if r.kept.is_empty() {
                    CheckedOut::Restored { node: id, key, files: r.files, bytes: r.bytes, moved: r.moved }
                } else {
                    CheckedOut::Kept { node: id, key, outs: r.kept, files: r.files, bytes: r.bytes }
                });
            }
            Decision::Run(reason) => {
                missing_root.insert(pos, id.clone());
                out.push(CheckedOut::Missing { node: id, reason: reason.to_string() });
            }
        }
    }
    Ok(out)
}

/// `orchestrate pull SPEC [NODE...]`: fetches from the remote every node of
/// the DAG that the local cache lacks, in waves (a node's key needs its
/// upstream outputs, local or just fetched); each wave's records and objects
/// in parallel. Nodes the remote lacks, and everything below them, stay
/// missing.
pub fn pull_spec(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    env: &EnvProvider,
    remote: &crate::remote::Remote,
    progress: &crate::remote::Progress,
) -> Result<crate::remote::Transfer, crate::remote::RemoteError> {
    super::refuse_outs_over_workspace(ws, spec, dag)?;
    let index = ws.index()?;
    let mut known: BTreeMap<String, Vec<OutputRecord>> = BTreeMap::new();
    let mut unresolved: BTreeSet<usize> = dag.order.iter().copied().collect();
    let mut total = crate::remote::Transfer::default();
    let mut env_part: Option<crate::dag::key::EnvPart> = None;
    loop {
        let wave: Vec<usize> = dag
            .order
            .iter()
            .copied()
            .filter(|&p| {
                unresolved.contains(&p) && dag.parents(p).iter().all(|&q| known.contains_key(dag.nodes[q].id()))
            })
            .collect();
        if wave.is_empty() {
            break;
        }
        let mut keys = Vec::new();
        for pos in wave {
            unresolved.remove(&pos);
            let node = &dag.nodes[pos];
            let id = node.id().to_string();
            let part = if node.op.numerical() {
                if env_part.is_none() {
                    env_part = Some(env().map_err(crate::remote::RemoteError::Config)?);
                }
                Some(super::slurm::node_env(spec.executor, &node.def, env_part.as_ref().expect("set above")))
            } else {
                None
            };
            let record = match hash_inputs(ws, &index, node, &spec.base_dir, &known, part) {
                Ok(r) => r,
                Err(e) => {
                    total.failed.push(format!("node '{id}': {e}"));
                    continue;
                }
            };
            let key = record.key();
            match decide(ws, &index, &spec.base_dir, spec.spec_ref(), &id, &record, &key, false)? {
                Decision::Hit(outputs) => {
                    total.present += 1;
                    known.insert(id, outputs);
                }
                Decision::Restore(cached, _) => {
                    total.present += 1;
                    known.insert(id, cached.outputs);
                }
                Decision::Run(_) => keys
                    .push((crate::remote::LocalNode { id: node.id(), spec: &spec.name, outputs: &node.outputs }, key)),
            }
        }
        if keys.is_empty() {
            continue;
        }
        let (t, done) = crate::remote::pull(ws, &index, remote, &keys, &spec.base_dir, progress)?;
        total.nodes += t.nodes;
        total.objects += t.objects;
        total.bytes = t.bytes;
        total.missing.extend(t.missing);
        total.failed.extend(t.failed);
        total.unverified.extend(t.unverified);
        for (id, node) in done {
            known.insert(id, node.outputs);
        }
    }
    for pos in unresolved {
        total.missing.push(format!("{} (below a node that is missing)", dag.nodes[pos].id()));
    }
    Ok(total)
}
