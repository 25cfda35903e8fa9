//! `run --check`: re-executes cached nodes and compares every output's hash
//! with the cached one, as `nix build --check` rebuilds a path and compares.
//! Nothing in the cache changes: the re-executed outputs are stored by
//! content (so a differing one can be looked at), the node's record stays,
//! and outputs in the user's tree are put back as the cache has them.
//!
//! Each node is resolved from the cache in dependency order (its key from
//! its cached inputs, as a run computes it); a node the workspace lacks is
//! taken from the remote when one is given (`--check --remote`: how a team
//! verifies a colleague's result before trusting it), else it is said to be
//! not cached and what reads it cannot be checked.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::node::{self, NodeJob};
use super::EnvProvider;
use crate::dag::Dag;
use crate::spec::Spec;
use crate::store::objects::dir_listing;
use crate::store::{CachedNode, Key, ObjectInfo, OutputKind, OutputRecord, StoreError, Workspace};

/// How a node's re-execution compared with its cached outputs.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CheckOutcome {
    /// Every output has the cached hash.
    Reproduced,
    /// An output's bytes differ: the first one (in declaration order).
    Differs {
        output: String,
        cached: ObjectInfo,
        rerun: ObjectInfo,
        /// Where the bytes first differ (`byte 17 (line 2)`, `file 'b.txt'`).
        first_difference: String,
        /// The re-executed bytes, kept in the store until `gc`.
        rerun_path: PathBuf,
    },
    /// Not in the cache (nor on the remote): nothing to compare with.
    NotCached { why: String },
    /// The re-execution failed.
    Failed { error: String },
}

/// One node's check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Key>,
    #[serde(flatten)]
    pub outcome: CheckOutcome,
    /// The cached copy came from the remote for this check.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub from_remote: bool,
    pub seconds: f64,
    /// The cached record, for counter-signing what reproduced.
    #[serde(skip)]
    pub cached: Option<CachedNode>,
}

impl CheckResult {
    pub fn reproduced(&self) -> bool {
        matches!(self.outcome, CheckOutcome::Reproduced)
    }
}

/// Checks `targets` (none: every node of the DAG), each after the nodes it
/// reads are resolved from the cache.
pub fn check(
    ws: &Workspace,
    spec: &Spec,
    dag: &Dag,
    targets: &BTreeSet<String>,
    env: &EnvProvider,
    remote: Option<&crate::remote::Remote>,
) -> Result<Vec<CheckResult>, StoreError> {
    super::refuse_outs_over_workspace(ws, spec, dag)?;
    let index = ws.index()?;
    let run_id = super::new_run_id();
    let cancel = AtomicBool::new(false);
    let mut env_part: Option<Result<crate::runtime::EnvPart, String>> = None;
    let mut known: BTreeMap<String, Vec<OutputRecord>> = BTreeMap::new();
    let mut results = Vec::new();
    let quiet = crate::remote::sync_progress_none();
    for &pos in &dag.order {
        if super::signal::interrupted() {
            break;
        }
        let node = &dag.nodes[pos];
        let id = node.id().to_string();
        let wanted = targets.is_empty() || targets.contains(&id);
        let started = Instant::now();
        let result =
            |key: Option<Key>, outcome: CheckOutcome, from_remote: bool, cached: Option<CachedNode>| CheckResult {
                node: id.clone(),
                key,
                outcome,
                from_remote,
                seconds: started.elapsed().as_secs_f64(),
                cached,
            };
        if let Some(p) = dag.parents(pos).iter().map(|&p| dag.nodes[p].id()).find(|p| !known.contains_key(*p)) {
            if wanted {
                let why = format!("it reads '{p}', which is not cached");
                results.push(result(None, CheckOutcome::NotCached { why }, false, None));
            }
            continue;
        }
        let env = if node.op.numerical() {
            match env_part.get_or_insert_with(env) {
                Ok(e) => Some(super::slurm::node_env(spec.executor, &node.def, e)),
                Err(e) => {
                    let error = format!("cannot determine the numerical environment: {e}");
                    results.push(result(None, CheckOutcome::Failed { error: error.to_string() }, false, None));
                    continue;
                }
            }
        } else {
            None
        };
        let upstream: BTreeMap<String, Vec<OutputRecord>> = dag
            .parents(pos)
            .iter()
            .map(|&p| {
                let pid = dag.nodes[p].id().to_string();
                let outs = known[&pid].clone();
                (pid, outs)
            })
            .collect();
        let job = NodeJob {
            ws,
            index: &index,
            node,
            spec_name: &spec.name,
            spec_profile: spec.profile.as_deref(),
            spec_dir: &spec.base_dir,
            run_id: &run_id,
            upstream: &upstream,
            env,
            force: true,
            cancel: &cancel,
            cpu: None,
            remote: None,
        };
        let record = match job.record() {
            Ok(r) => r,
            Err(error) => {
                if wanted {
                    results.push(result(None, CheckOutcome::Failed { error: error.to_string() }, false, None));
                }
                continue;
            }
        };
        let key = record.key();
        let mut from_remote = false;
        let mut cached = index.lookup(&key)?;
        if cached.is_none() {
            if let Some(remote) = remote {
                let local = crate::remote::LocalNode { id: &id, spec: &spec.name, outputs: &node.outputs };
                match crate::remote::fetch_node(ws, &index, remote, &key, local, &spec.base_dir, &quiet) {
                    Ok(Some(_)) => {
                        from_remote = true;
                        cached = index.lookup(&key)?;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if wanted {
                            let why = format!("the remote's copy was not taken: {e}");
                            results.push(result(Some(key), CheckOutcome::NotCached { why }, false, None));
                        }
                        continue;
                    }
                }
            }
        }
        let Some(cached) = cached else {
            if wanted {
                let why = match remote {
                    Some(r) => format!("key {} is in neither this workspace nor {}", key.short(), r.url),
                    None => {
                        format!("key {} is not in this workspace (run it first, or check with --remote)", key.short())
                    }
                };
                results.push(result(Some(key), CheckOutcome::NotCached { why }, false, None));
            }
            continue;
        };
        known.insert(id.clone(), cached.outputs.clone());
        if !wanted {
            continue;
        }
        let rerun = with_interrupts(&cancel, || node::recheck(&job, &record, &cached));
        let outcome = match rerun {
            Ok(outputs) => compare(ws, &cached, &outputs),
            Err(error) => CheckOutcome::Failed { error: error.to_string() },
        };
        results.push(result(Some(key), outcome, from_remote, Some(cached)));
    }
    Ok(results)
}

/// Runs `f` while a watcher turns an interrupt (Ctrl-C) into `cancel`, so
/// the node being re-executed stops as a run's would.
fn with_interrupts<T>(cancel: &AtomicBool, f: impl FnOnce() -> T) -> T {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                if super::signal::interrupted() {
                    cancel.store(true, Ordering::SeqCst);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = f();
        done.store(true, Ordering::SeqCst);
        out
    })
}

/// The first output whose re-executed hash differs from the cached one. No
/// output holds a wall-clock duration (they are in the record, see
/// [`crate::costs`]), so a deterministic node reproduces every byte.
fn compare(ws: &Workspace, cached: &CachedNode, rerun: &[OutputRecord]) -> CheckOutcome {
    for o in &cached.outputs {
        let Some(r) = rerun.iter().find(|r| r.name == o.name) else {
            return CheckOutcome::Failed { error: format!("the re-execution wrote no output '{}'", o.name) };
        };
        if r.object.hash != o.object.hash {
            return CheckOutcome::Differs {
                output: o.name.clone(),
                cached: o.object.clone(),
                rerun: r.object.clone(),
                first_difference: first_difference(ws, o, &r.object),
                rerun_path: ws.object_path(&r.object.hash),
            };
        }
    }
    CheckOutcome::Reproduced
}

/// Where two versions of an output first differ: the byte and line of a
/// file, or the first file of a folder that differs (and where in it).
fn first_difference(ws: &Workspace, cached: &OutputRecord, rerun: &ObjectInfo) -> String {
    let (a, b) = (ws.object_path(&cached.object.hash), ws.object_path(&rerun.hash));
    if !cached.stored() || std::fs::symlink_metadata(&a).is_err() {
        return "the cached bytes are no longer in this workspace's store (dropped or collected)".into();
    }
    match (cached.object.kind, rerun.kind) {
        (OutputKind::File, OutputKind::File) => file_difference(&cached.name, &a, &b),
        (OutputKind::Dir, OutputKind::Dir) => {
            let (Ok((old, _)), Ok((new, _))) = (dir_listing(&a), dir_listing(&b)) else {
                return "a folder's listing could not be read".into();
            };
            let old: BTreeMap<&str, &str> = old.iter().map(|(p, h, _)| (p.as_str(), h.as_str())).collect();
            let new: BTreeMap<&str, &str> = new.iter().map(|(p, h, _)| (p.as_str(), h.as_str())).collect();
            for (path, hash) in &old {
                match new.get(path) {
                    None => return format!("file '{path}' is missing from the re-execution"),
                    Some(h) if h != hash => {
                        return format!("file '{path}', at {}", first_byte(&a.join(path), &b.join(path)))
                    }
                    Some(_) => {}
                }
            }
            match new.keys().find(|p| !old.contains_key(*p)) {
                Some(p) => format!("file '{p}' is new in the re-execution"),
                None => "the same files with the same bytes (the listing differs)".into(),
            }
        }
        _ => "one is a file, the other a folder".into(),
    }
}

/// Where two versions of a file output differ: the first differing byte and
/// line, and what it is: for a training state, the first field or tensor
/// element (`tensor model.embed_tokens.weight: element 17 differs`); for a
/// JSON file (a training node's metrics), the first differing field, whose
/// path names the iteration (`field history[3].mean_reward: 0.25 vs 0.5`).
fn file_difference(output: &str, a: &Path, b: &Path) -> String {
    let at = first_byte(a, b);
    let what = if output == crate::store::gc::STATE_OUTPUT {
        // Side by side, a block at a time: never both states in memory.
        crate::train::state::first_difference_in_files(a, b, &[]).ok().flatten()
    } else {
        let json = |p: &Path| -> Option<serde_json::Value> {
            let bytes = crate::fsread::read_regular(p, MAX_JSON_COMPARED).ok()?;
            serde_json::from_slice(&bytes).ok()
        };
        match (json(a), json(b)) {
            (Some(x), Some(y)) => crate::train::state::json_first_difference(&x, &y),
            _ => None,
        }
    };
    match what {
        Some(what) => format!("{at}: {what}"),
        None => at,
    }
}

/// JSON outputs larger than this are compared by bytes only.
const MAX_JSON_COMPARED: u64 = 64 << 20;

/// The first differing byte of two files, with its line (1-based).
fn first_byte(a: &Path, b: &Path) -> String {
    let (Ok(fa), Ok(fb)) = (std::fs::File::open(a), std::fs::File::open(b)) else {
        return "the files could not be opened".into();
    };
    let (mut ra, mut rb) = (std::io::BufReader::new(fa).bytes(), std::io::BufReader::new(fb).bytes());
    let (mut offset, mut line) = (0u64, 1u64);
    loop {
        match (ra.next().transpose(), rb.next().transpose()) {
            (Ok(Some(x)), Ok(Some(y))) if x == y => {
                offset += 1;
                line += u64::from(x == b'\n');
            }
            (Ok(None), Ok(None)) => return "no byte differs".into(),
            (Ok(None), Ok(Some(_))) => return format!("byte {offset} (line {line}): the cached bytes end there"),
            (Ok(Some(_)), Ok(None)) => return format!("byte {offset} (line {line}): the re-executed bytes end there"),
            (Ok(Some(_)), Ok(Some(_))) => return format!("byte {offset} (line {line})"),
            _ => return format!("byte {offset}: a read failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_training_state_or_metrics_difference_names_the_tensor_or_the_iteration() {
        let dir = tempfile::tempdir().unwrap();
        let meta = serde_json::json!({"kind": "grpo", "next_iteration": 2});
        let state = |name: &str, w: f32| {
            let path = dir.path().join(name);
            let tensors = [("model.w".to_string(), vec![2], vec![1.0, w]), ("adam.m".to_string(), vec![1], vec![0.5])];
            crate::train::state::write_state(&path, &meta, &tensors).unwrap();
            path
        };
        let (a, b) = (state("a", 2.0), state("b", 3.0));
        let said = file_difference("state", &a, &b);
        assert!(said.starts_with("byte ") && said.contains("tensor model.w: element 1 differs (2 vs 3)"), "{said}");

        let metrics = |name: &str, reward: f64| {
            let path = dir.path().join(name);
            let m = serde_json::json!({"history": [{"mean_reward": 0.25}, {"mean_reward": reward}]});
            std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
            path
        };
        let said = file_difference("metrics", &metrics("m1", 0.5), &metrics("m2", 0.75));
        assert!(said.contains("(line 7)") && said.contains("history[1].mean_reward: 0.5 vs 0.75"), "{said}");
        // Anything else: the byte and line alone.
        std::fs::write(dir.path().join("t1"), "same\nold\n").unwrap();
        std::fs::write(dir.path().join("t2"), "same\nnew\n").unwrap();
        assert_eq!(file_difference("out.txt", &dir.path().join("t1"), &dir.path().join("t2")), "byte 5 (line 2)");
    }
}
