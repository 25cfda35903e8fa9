//! Compiling a [`Spec`] into a graph of nodes, with every wiring mistake
//! reported against the spec's source: unknown ops, bad params, references to
//! missing nodes or outputs, two nodes writing one file, and cycles (named).

pub mod deps;
mod isolation;
pub use isolation::{Guarded, GuardedData};
pub mod key;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use petgraph::algo::{tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::ops::{AnyOp, OutputDecl, Params, Registry};
use crate::spec::parsed::ParseCache;
use crate::spec::{did_you_mean, schema, NodeDef, OutputRef, Spec, SpecError, SpecErrorKind};

pub use crate::ops::FILE_DEP_PREFIX;

/// A node ready to schedule.
#[derive(Clone)]
pub struct DagNode {
    pub def: NodeDef,
    pub op: Arc<dyn AnyOp>,
    /// Parsed once by the op; `params.value()` is what the key hashes.
    pub params: Params,
    pub outputs: Vec<OutputDecl>,
    /// Explicit inputs, plus one `dep:PATH` input per file dep another node writes.
    pub inputs: BTreeMap<String, Vec<OutputRef>>,
    /// File deps no node writes: hashed from disk into the key.
    pub files: Vec<String>,
    /// Folder and glob deps: hashed file by file from disk into the key.
    pub trees: Vec<deps::TreeDep>,
    /// Params files and the keys of each in the key (`params_files:`).
    pub params_files: Vec<(String, Vec<String>)>,
    /// The paths of the spec's folder its command names
    /// ([`crate::ops::CommandReads::named`]), which isolation reads.
    pub named: Vec<String>,
    /// The DAG's data, which a file a node reads could be a copy of under
    /// another path: checked by content when a node whose role forbids some
    /// of it is keyed. One list, shared by every node.
    pub guarded: Arc<[Guarded]>,
}

impl DagNode {
    pub fn id(&self) -> &str {
        &self.def.id
    }

    /// The paths (relative to the spec's folder) of the outputs this node
    /// writes in the user's tree: a shell node's `outs`.
    pub fn tree_outs(&self) -> impl Iterator<Item = &String> {
        self.outputs.iter().filter_map(|o| o.workspace_path.as_ref())
    }
}

/// The compiled pipeline.
pub struct Dag {
    pub graph: DiGraph<usize, ()>,
    pub nodes: Vec<DagNode>,
    index: HashMap<String, NodeIndex>,
    /// Node positions in a topological order (ties broken by id).
    pub order: Vec<usize>,
}

impl Dag {
    /// The DAG cut down to `targets` and every node they read from,
    /// transitively (`run NODE…`, as `dvc repro STAGE` and Snakemake
    /// targets): each kept node as it was compiled, since a key depends only
    /// on what its node reads, so no spec is compiled again. Ids that are no
    /// node are ignored (the caller checks what was named).
    pub fn restrict(self, targets: &BTreeSet<String>) -> Dag {
        let mut keep = vec![false; self.nodes.len()];
        let mut stack: Vec<usize> = targets.iter().filter_map(|id| self.position(id)).collect();
        while let Some(pos) = stack.pop() {
            if !std::mem::replace(&mut keep[pos], true) {
                stack.extend(self.parents(pos));
            }
        }
        let mut moved = vec![usize::MAX; self.nodes.len()];
        let mut nodes = Vec::with_capacity(keep.iter().filter(|k| **k).count());
        for (old, node) in self.nodes.into_iter().enumerate().filter(|(i, _)| keep[*i]) {
            moved[old] = nodes.len();
            nodes.push(node);
        }
        let mut graph: DiGraph<usize, ()> = DiGraph::with_capacity(nodes.len(), self.graph.edge_count());
        let mut index = HashMap::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            index.insert(n.def.id.clone(), graph.add_node(i));
        }
        for e in self.graph.edge_references() {
            let (from, to) = (self.graph[e.source()], self.graph[e.target()]);
            if keep[from] && keep[to] {
                graph.add_edge(NodeIndex::new(moved[from]), NodeIndex::new(moved[to]), ());
            }
        }
        // A topological order filtered is a topological order of what is left.
        let order = self.order.iter().filter(|p| keep[**p]).map(|p| moved[*p]).collect();
        Dag { graph, nodes, index, order }
    }

    pub fn position(&self, id: &str) -> Option<usize> {
        self.index.get(id).map(|ix| self.graph[*ix])
    }

    pub fn get(&self, id: &str) -> Option<&DagNode> {
        self.position(id).map(|i| &self.nodes[i])
    }

    /// Positions of the nodes this one reads from.
    pub fn parents(&self, pos: usize) -> Vec<usize> {
        let ix = self.index[self.nodes[pos].id()];
        self.graph.neighbors_directed(ix, petgraph::Direction::Incoming).map(|p| self.graph[p]).collect()
    }

    /// Positions of the nodes that read from this one.
    pub fn children(&self, pos: usize) -> Vec<usize> {
        let ix = self.index[self.nodes[pos].id()];
        self.graph.neighbors_directed(ix, petgraph::Direction::Outgoing).map(|p| self.graph[p]).collect()
    }

    /// Every node downstream of `pos`, not including it.
    pub fn descendants(&self, pos: usize) -> Vec<usize> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = self.children(pos);
        let mut out = Vec::new();
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut seen[n], true) {
                out.push(n);
                stack.extend(self.children(n));
            }
        }
        out.sort_unstable();
        out
    }

    /// Ids of all nodes, for error messages.
    pub fn ids(&self) -> Vec<&str> {
        self.nodes.iter().map(DagNode::id).collect()
    }
}

fn node_path(def: &NodeDef, rest: &[&str]) -> Vec<String> {
    ["nodes", def.base_id.as_str()].iter().chain(rest).map(|s| s.to_string()).collect()
}

/// Compiles a spec against the op registry.
pub fn compile(spec: &Spec, registry: &Registry) -> Result<Dag, SpecError> {
    compile_with(spec, registry, None)
}

/// [`compile`], with the workspace's parse cache: params that passed the
/// params' schema check before (the same ops and params, this executable)
/// are not checked again, and params that pass are noted there, kept once the
/// cache is saved.
pub fn compile_with(spec: &Spec, registry: &Registry, parsed: Option<&ParseCache>) -> Result<Dag, SpecError> {
    // Every node shares the DAG's guarded data, set once it is known.
    let unguarded: Arc<[Guarded]> = Arc::from([]);
    let mut nodes: Vec<DagNode> = Vec::with_capacity(spec.nodes.len());
    for def in &spec.nodes {
        let Some(op) = registry.get(&def.op) else {
            let known: Vec<&str> = registry.names().collect();
            return Err(SpecError::new(
                SpecErrorKind::UnknownOp,
                spec.sources.locate_value(&node_path(def, &["op"])),
                format!(
                    "unknown op '{}' in node '{}'{}; known ops: {}",
                    def.op,
                    def.base_id,
                    did_you_mean(&def.op, known.iter().copied()),
                    known.join(", ")
                ),
            ));
        };
        if let Some(threads) = def.threads {
            let at = spec.sources.locate_value(&node_path(def, &["threads"]));
            if !op.numerical() {
                return Err(SpecError::new(
                    SpecErrorKind::UnknownKey,
                    at,
                    format!(
                        "node '{}' ({}): threads: only numerical ops (libtorch) take a thread count; {} is not one",
                        def.id, def.op, def.op
                    ),
                ));
            }
            if !(1..=crate::runtime::MAX_THREADS).contains(&threads) {
                return Err(SpecError::new(
                    SpecErrorKind::WrongType,
                    at,
                    format!(
                        "node '{}': threads: {threads} is not a thread count from 1 to {}",
                        def.id,
                        crate::runtime::MAX_THREADS
                    ),
                ));
            }
        }
        // The resolved params (defaults filled in) are what the key hashes.
        let params = match op.parse(&def.params) {
            Ok(resolved) => resolved,
            Err(e) => {
                // A value that came from the matrix is reported where the matrix wrote it.
                let dotted = e.path.join(".");
                let axis = def.binding.keys().find(|a| dotted == **a || dotted.starts_with(&format!("{a}.")));
                let path = match axis {
                    Some(axis) => node_path(def, &["matrix", axis]),
                    None => {
                        let mut p = node_path(def, &["params"]);
                        p.extend(e.path.iter().cloned());
                        p
                    }
                };
                let kind = if e.unknown_key { SpecErrorKind::UnknownKey } else { SpecErrorKind::WrongType };
                let at = if e.unknown_key { spec.sources.locate(&path) } else { spec.sources.locate_value(&path) };
                let field = if e.unknown_key || e.path.is_empty() {
                    String::new()
                } else {
                    format!("params.{}: ", e.path.join("."))
                };
                return Err(SpecError::new(kind, at, format!("node '{}' ({}): {field}{}", def.id, def.op, e.message)));
            }
        };
        if let Some(declared) = op.inputs(&params) {
            for name in def.inputs.keys() {
                if !declared.iter().any(|d| d.name == name) {
                    let names: Vec<&str> = declared.iter().map(|d| d.name).collect();
                    return Err(SpecError::new(
                        SpecErrorKind::UnknownKey,
                        spec.sources.locate(&node_path(def, &["inputs", name])),
                        format!(
                            "node '{}' ({}) has no input '{name}'{}; its inputs: {}",
                            def.id,
                            def.op,
                            did_you_mean(name, names.iter().copied()),
                            if names.is_empty() { "none".to_string() } else { names.join(", ") }
                        ),
                    ));
                }
            }
            if let Some(missing) = declared.iter().find(|d| d.required && !def.inputs.contains_key(d.name)) {
                return Err(SpecError::new(
                    SpecErrorKind::MissingField,
                    spec.sources.locate(&node_path(def, &[])),
                    format!("node '{}' ({}) needs input '{}': {}", def.id, def.op, missing.name, missing.description),
                ));
            }
        }
        let outputs = op.outputs(&params);
        nodes.push(DagNode {
            def: def.clone(),
            op: op.clone(),
            params,
            outputs,
            inputs: BTreeMap::new(),
            files: Vec::new(),
            trees: Vec::new(),
            params_files: Vec::new(),
            named: Vec::new(),
            guarded: Arc::clone(&unguarded),
        });
    }

    // After the typed checks, so their clearer messages come first.
    let checked = parsed.and_then(|p| Some((p, p.params_checked_name(&spec.nodes)?)));
    match checked {
        Some((parsed, name)) if parsed.params_checked(&name) => {}
        Some((parsed, name)) => {
            schema::check_constraints(spec, registry)?;
            parsed.remember_params_checked(name, spec.nodes.len());
        }
        None => schema::check_constraints(spec, registry)?,
    }

    let by_id: HashMap<String, usize> = nodes.iter().enumerate().map(|(i, n)| (n.def.id.clone(), i)).collect();
    let mut expansions: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if !n.def.binding.is_empty() {
            expansions.entry(n.def.base_id.clone()).or_default().push(i);
        }
    }
    let mut writers: HashMap<String, (usize, String)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for out in &n.outputs {
            if let Some(path) = &out.workspace_path {
                if let Some((other, _)) = writers.insert(path.clone(), (i, out.name.clone())) {
                    return Err(SpecError::new(
                        SpecErrorKind::DuplicateId,
                        spec.sources.locate(&node_path(&n.def, &["params", "outs"])),
                        format!(
                            "'{path}' is written by both '{}' and '{}'; each file must have one writer",
                            nodes[other].def.id, n.def.id
                        ),
                    ));
                }
            }
        }
    }

    refuse_overlapping_outs(spec, &writers, &nodes)?;
    refuse_outs_over_spec_files(spec, &writers, &nodes)?;

    // What each Python program imports, found once for all nodes that run it.
    let mut imports = crate::reward::python::Imports::default();
    // What each shell script a command runs runs and names, read once.
    let mut scripts = crate::ops::Scripts::default();
    for i in 0..nodes.len() {
        let def = &nodes[i].def;
        let mut inputs = BTreeMap::new();
        for (name, refs) in &def.inputs {
            let mut resolved = Vec::new();
            for (j, r) in refs.iter().enumerate() {
                let at = || {
                    let mut p = node_path(def, &["inputs", name]);
                    if refs.len() > 1 {
                        p.push(j.to_string());
                    }
                    spec.sources.locate_value(&p)
                };
                let target = resolve_node(def, r, &by_id, &expansions, &nodes).map_err(|m| {
                    SpecError::new(
                        SpecErrorKind::MissingReference,
                        at(),
                        format!("input '{name}' of node '{}': {m}", def.id),
                    )
                })?;
                let outputs = &nodes[target].outputs;
                if !outputs.iter().any(|o| o.name == r.output) {
                    let names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
                    return Err(SpecError::new(
                        SpecErrorKind::MissingReference,
                        at(),
                        format!(
                            "input '{name}' of node '{}': node '{}' has no output '{}'{}; its outputs: {}",
                            def.id,
                            nodes[target].def.id,
                            r.output,
                            did_you_mean(&r.output, names.iter().copied()),
                            if names.is_empty() { "none".to_string() } else { names.join(", ") }
                        ),
                    ));
                }
                if target == i {
                    return Err(SpecError::new(
                        SpecErrorKind::Cycle,
                        at(),
                        format!("cycle: node '{}' reads its own output '{}'", def.id, r.output),
                    ));
                }
                resolved.push(OutputRef { node: nodes[target].def.id.clone(), output: r.output.clone() });
            }
            inputs.insert(name.clone(), resolved);
        }
        let implied = nodes[i].op.implied_inputs(&nodes[i].params, &spec.base_dir).map_err(|e| {
            SpecError::new(
                SpecErrorKind::MissingReference,
                spec.sources.locate(&node_path(def, &["params"])),
                format!("node '{}': {e}", def.id),
            )
        })?;
        for (name, reference) in implied {
            let at = || spec.sources.locate(&node_path(def, &["params"]));
            let Some((n, o)) = reference.split_once(':') else {
                return Err(SpecError::new(
                    SpecErrorKind::MissingReference,
                    at(),
                    format!("node '{}': '{reference}' is not NODE:OUTPUT", def.id),
                ));
            };
            let r = OutputRef { node: n.to_string(), output: o.to_string() };
            let target = resolve_node(def, &r, &by_id, &expansions, &nodes).map_err(|m| {
                SpecError::new(SpecErrorKind::MissingReference, at(), format!("node '{}' evidence: {m}", def.id))
            })?;
            if !nodes[target].outputs.iter().any(|out| out.name == r.output) {
                return Err(SpecError::new(
                    SpecErrorKind::MissingReference,
                    at(),
                    format!("node '{}' evidence: node '{}' has no output '{}'", def.id, nodes[target].def.id, r.output),
                ));
            }
            inputs.insert(name, vec![OutputRef { node: nodes[target].def.id.clone(), output: r.output }]);
        }
        let mut files = Vec::new();
        let mut trees = Vec::new();
        let deps_at = || spec.sources.locate_value(&node_path(def, &["params", "deps"]));
        let dep_error = |kind: SpecErrorKind, message: String| SpecError::new(kind, deps_at(), message);
        // A writer of `path` itself, else of the folder holding it (outs
        // never nest): a lookup per level of the path (a scan of every
        // writer, formatting each, made validating 10,000 nodes take 2.3 s).
        let writer_of = |path: &str| -> Option<(usize, String, String)> {
            let mut at = Some(path);
            while let Some(p) = at {
                if let Some((n, out)) = writers.get(p) {
                    return Some((*n, out.clone(), p.to_string()));
                }
                at = p.rfind('/').map(|i| &p[..i]);
            }
            None
        };
        let edge = |inputs: &mut BTreeMap<String, Vec<OutputRef>>, dep: &str, w: usize, out: String| {
            inputs.insert(
                format!("{FILE_DEP_PREFIX}{dep}"),
                vec![OutputRef { node: nodes[w].def.id.clone(), output: out }],
            );
        };
        for dep in nodes[i].op.file_deps(&nodes[i].params, &spec.base_dir) {
            let cycle = || {
                dep_error(
                    SpecErrorKind::Cycle,
                    format!("cycle: node '{}' lists '{dep}' both as a dep and as an out", def.id),
                )
            };
            if deps::is_glob(&dep) {
                let glob = deps::glob_matcher(&dep)
                    .map_err(|m| dep_error(SpecErrorKind::WrongType, format!("node '{}': dep {m}", def.id)))?;
                let mut written: Vec<(&String, usize, String)> = writers
                    .iter()
                    .filter(|(w, _)| glob.is_match(w.as_str()))
                    .map(|(w, (n, o))| (w, *n, o.clone()))
                    .collect();
                written.sort();
                for (w, n, out) in &written {
                    if *n == i {
                        return Err(cycle());
                    }
                    edge(&mut inputs, w, *n, out.clone());
                }
                let base = deps::glob_base(&dep);
                let on_disk = if std::fs::symlink_metadata(spec.base_dir.join(&base)).is_ok_and(|m| m.is_dir()) {
                    deps::walk(&spec.base_dir, &base, Some(&glob)).map_err(|m| {
                        dep_error(SpecErrorKind::MissingReference, format!("node '{}': dep '{dep}': {m}", def.id))
                    })?
                } else {
                    Vec::new()
                };
                let matches: Vec<String> = on_disk.into_iter().filter(|f| writer_of(f).is_none()).collect();
                if matches.is_empty() && written.is_empty() {
                    return Err(dep_error(
                        SpecErrorKind::MissingReference,
                        format!(
                            "node '{}': dep '{dep}' matches no file under {} and no node's out",
                            def.id,
                            spec.base_dir.join(&base).display()
                        ),
                    ));
                }
                if !matches.is_empty() {
                    trees.push(deps::TreeDep { name: dep.clone(), kind: deps::TreeKind::Glob { matches } });
                }
                continue;
            }
            if let Some((w, out, _)) = writer_of(&dep) {
                if w == i {
                    return Err(cycle());
                }
                edge(&mut inputs, &dep, w, out);
                continue;
            }
            let path = spec.base_dir.join(&dep);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {
                    // Outs of other nodes inside the folder are inputs; the rest is hashed from disk.
                    let mut skip = Vec::new();
                    let folder = format!("{dep}/");
                    let mut inside: Vec<(&String, &(usize, String))> =
                        writers.iter().filter(|(w, _)| w.starts_with(&folder)).collect();
                    inside.sort();
                    for (w, (n, out)) in inside {
                        if *n == i {
                            return Err(cycle());
                        }
                        edge(&mut inputs, w, *n, out.clone());
                        skip.push(w.clone());
                    }
                    trees.push(deps::TreeDep { name: dep, kind: deps::TreeKind::Dir { skip } });
                }
                Ok(m) if m.is_file() => files.push(dep),
                Ok(m) => {
                    let instead = match nodes[i].op.linked_dep_help() {
                        Some(help) if m.file_type().is_symlink() => format!(" ({help})"),
                        _ => String::new(),
                    };
                    return Err(dep_error(
                        SpecErrorKind::MissingReference,
                        format!(
                            "node '{}': dep '{dep}' ({}) is a symbolic link or a special file; deps are read from real files and folders only{instead}",
                            def.id,
                            path.display()
                        ),
                    ));
                }
                Err(_) => {
                    let near = deps::neighbours(&spec.base_dir, &dep);
                    let mut candidates: Vec<&str> = near.iter().map(String::as_str).collect();
                    candidates.extend(writers.keys().map(String::as_str));
                    return Err(dep_error(
                        SpecErrorKind::MissingReference,
                        format!(
                            "node '{}': dep '{dep}' does not exist ({}) and no node writes it{}",
                            def.id,
                            path.display(),
                            did_you_mean(&dep, candidates)
                        ),
                    ));
                }
            }
        }
        // The programs its command runs (`python3 train.py`, `./score.sh`):
        // keyed as a file dep is, where no dep covers one already; an edge
        // where another node writes one; passed over where there is none, or
        // it is a link or the node's own out (what it was before: nothing).
        let command = scripts.expand(&spec.base_dir, nodes[i].op.command_reads(&nodes[i].params, &spec.base_dir));
        let imported =
            command.python.iter().flat_map(|run| imports.of(&spec.base_dir, run).to_vec()).collect::<Vec<_>>();
        // Whether a node writes `path`; where another one does, an edge to it
        // (unless `path`, or the out holding it, has one already).
        let edge_to_writer = |inputs: &mut BTreeMap<String, Vec<OutputRef>>, path: &str| {
            let Some((w, out, at)) = writer_of(path) else { return false };
            let edged = |at: &str| inputs.contains_key(&format!("{FILE_DEP_PREFIX}{at}"));
            if w != i && !edged(&at) && !edged(path) {
                edge(inputs, path, w, out);
            }
            true
        };
        for program in command.programs.into_iter().chain(imported) {
            let edged = inputs.contains_key(&format!("{FILE_DEP_PREFIX}{program}"));
            if files.contains(&program) || trees.iter().any(|t| t.covers(&program)) || edged {
                continue;
            }
            if edge_to_writer(&mut inputs, &program) {
                continue;
            }
            if std::fs::symlink_metadata(spec.base_dir.join(&program)).is_ok_and(|m| m.is_file()) {
                files.push(program);
            }
        }
        // A path its command names that another node writes (`python3
        // eval.py ckpt/model.pt`, node `train` writing `ckpt`): an edge, as
        // a dep would be, so it runs after the writer, its key holds what the
        // writer made, and isolation sees what that output carries. Only the
        // path itself or a path inside a folder out: `mkdir -p data` names
        // no other node's `data/a.txt`.
        for path in &command.named {
            edge_to_writer(&mut inputs, path);
        }
        // Params files: each named key must be there now, unless a node writes
        // the file (an edge; its keys are read when that node has run).
        let mut params_files = Vec::new();
        for (file, keys) in nodes[i].op.params_files(&nodes[i].params) {
            let at = || spec.sources.locate_value(&node_path(def, &["params", "params_files", &file]));
            if let Some((w, out, _)) = writer_of(&file) {
                if w == i {
                    return Err(SpecError::new(
                        SpecErrorKind::Cycle,
                        at(),
                        format!("cycle: node '{}' reads params file '{file}' and writes it", def.id),
                    ));
                }
                edge(&mut inputs, &file, w, out);
            } else {
                let doc = crate::docfile::read(&spec.base_dir, &file).map_err(|m| {
                    SpecError::new(SpecErrorKind::MissingReference, at(), format!("node '{}': params file {m}", def.id))
                })?;
                for k in &keys {
                    let v = crate::docfile::lookup(&doc, k).map_err(|m| {
                        SpecError::new(
                            SpecErrorKind::MissingReference,
                            at(),
                            format!("node '{}': params file '{file}' has no key '{k}': {m}", def.id),
                        )
                    })?;
                    crate::docfile::exact_param(&file, k, v).map_err(|m| {
                        SpecError::new(SpecErrorKind::Constraint, at(), format!("node '{}': params file {m}", def.id))
                    })?;
                }
            }
            params_files.push((file, keys));
        }
        nodes[i].inputs = inputs;
        nodes[i].files = files;
        nodes[i].trees = trees;
        nodes[i].params_files = params_files;
        nodes[i].named = command.named;
    }

    let mut graph: DiGraph<usize, ()> = DiGraph::with_capacity(nodes.len(), nodes.len());
    let mut index = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        index.insert(n.def.id.clone(), graph.add_node(i));
    }
    for n in &nodes {
        let to = index[&n.def.id];
        let mut parents: Vec<&str> = n.inputs.values().flatten().map(|r| r.node.as_str()).collect();
        parents.sort_unstable();
        parents.dedup();
        for p in parents {
            graph.add_edge(index[p], to, ());
        }
    }
    let order: Vec<usize> = match toposort(&graph, None) {
        Ok(order) => order.into_iter().map(|ix| graph[ix]).collect(),
        Err(_) => return Err(cycle_error(spec, &graph, &nodes)),
    };
    let guarded: Arc<[Guarded]> = isolation::check(spec, &nodes, &order)?.into();
    for node in &mut nodes {
        node.guarded = Arc::clone(&guarded);
    }
    Ok(Dag { graph, nodes, index, order })
}

/// Refuses two outs one of which holds the other (DVC's overlapping outs),
/// in one node or two: an out is removed and stored whole, so the inner one
/// would be removed by the outer's run, or stored with it depending on which
/// finished first.
fn refuse_overlapping_outs(
    spec: &Spec,
    writers: &HashMap<String, (usize, String)>,
    nodes: &[DagNode],
) -> Result<(), SpecError> {
    let mut outs: Vec<&String> = writers.keys().collect();
    outs.sort();
    for inner in outs {
        let mut at = inner.rfind('/').map(|i| &inner[..i]);
        while let Some(outer) = at {
            if let Some((o, _)) = writers.get(outer) {
                let i = writers[inner].0;
                return Err(SpecError::new(
                    SpecErrorKind::Constraint,
                    spec.sources.locate_value(&node_path(&nodes[i].def, &["params", "outs"])),
                    format!(
                        "outs overlap: '{outer}' (node '{}') holds '{inner}' (node '{}'); an out is removed and \
                         stored whole, so the inner one would be removed or stored with the outer. Give each out \
                         its own path",
                        nodes[*o].def.id, nodes[i].def.id
                    ),
                ));
            }
            at = outer.rfind('/').map(|i| &outer[..i]);
        }
    }
    Ok(())
}

/// Refuses an out that is, or is a folder holding, the spec file or a file
/// it extends: removed before its command runs, the spec would be gone.
fn refuse_outs_over_spec_files(
    spec: &Spec,
    writers: &HashMap<String, (usize, String)>,
    nodes: &[DagNode],
) -> Result<(), SpecError> {
    let Ok(base) = spec.base_dir.canonicalize() else { return Ok(()) };
    // The real files, and the spec by the name it was given (a link to it is the user's too).
    let mut files = spec.files.clone();
    files.extend(spec.path.file_name().map(|name| base.join(name)));
    let mut outs: Vec<(&String, &usize)> = writers.iter().map(|(path, (n, _))| (path, n)).collect();
    outs.sort();
    for (out, &n) in outs {
        let at = base.join(out);
        if let Some(file) = files.iter().find(|f| f.starts_with(&at)) {
            let shown = file.strip_prefix(&base).unwrap_or(file);
            let what = if *file == at { "is".to_string() } else { format!("holds {}, which is", shown.display()) };
            return Err(SpecError::new(
                SpecErrorKind::Constraint,
                spec.sources.locate_value(&node_path(&nodes[n].def, &["params", "outs"])),
                format!(
                    "node '{}': out '{out}' {what} the spec file or a file it extends; an out is removed whole \
                     before its command runs, so the spec would be deleted. Write the node's files elsewhere",
                    nodes[n].def.id
                ),
            ));
        }
    }
    Ok(())
}

fn resolve_node(
    consumer: &NodeDef,
    r: &OutputRef,
    by_id: &HashMap<String, usize>,
    expansions: &HashMap<String, Vec<usize>>,
    nodes: &[DagNode],
) -> Result<usize, String> {
    if let Some(&i) = by_id.get(&r.node) {
        return Ok(i);
    }
    if let Some(exp) = expansions.get(r.node.as_str()) {
        // A matrix node is matched by the consumer's own matrix values.
        let matching: Vec<usize> = exp
            .iter()
            .copied()
            .filter(|&e| nodes[e].def.binding.iter().all(|(axis, v)| consumer.binding.get(axis) == Some(v)))
            .collect();
        if let [one] = matching.as_slice() {
            return Ok(*one);
        }
        let ids: Vec<&str> = exp.iter().map(|&e| nodes[e].def.id.as_str()).collect();
        return Err(format!(
            "'{}' is a matrix node expanded into {}; name one of them, or give '{}' the same matrix axes",
            r.node,
            ids.join(", "),
            consumer.base_id
        ));
    }
    let mut names: Vec<&str> = by_id.keys().map(String::as_str).collect();
    names.extend(expansions.keys().map(String::as_str));
    names.sort_unstable();
    names.dedup();
    Err(format!("no node '{}'{}", r.node, did_you_mean(&r.node, names.iter().copied())))
}

fn cycle_error(spec: &Spec, graph: &DiGraph<usize, ()>, nodes: &[DagNode]) -> SpecError {
    // Take the strongly connected component that holds a cycle and walk it.
    let mut sccs = tarjan_scc(graph);
    sccs.retain(|c| c.len() > 1);
    sccs.sort_by_key(|c| c.iter().map(|ix| nodes[graph[*ix]].def.id.clone()).min());
    let Some(component) = sccs.first() else {
        return SpecError::new(SpecErrorKind::Cycle, spec.sources.locate(&["nodes".into()]), "the nodes form a cycle");
    };
    let members: std::collections::HashSet<NodeIndex> = component.iter().copied().collect();
    let start = *component.iter().min_by_key(|ix| nodes[graph[**ix]].def.id.clone()).expect("non-empty");
    let mut path = vec![start];
    let mut cur = start;
    loop {
        let mut next: Vec<NodeIndex> = graph.neighbors(cur).filter(|n| members.contains(n)).collect();
        next.sort_by_key(|ix| nodes[graph[*ix]].def.id.clone());
        let Some(&n) = next.iter().find(|n| !path.contains(n) || **n == start).or(next.first()) else {
            break;
        };
        if n == start || path.contains(&n) {
            path.push(n);
            break;
        }
        path.push(n);
        cur = n;
    }
    let names: Vec<&str> = path.iter().map(|ix| nodes[graph[*ix]].def.id.as_str()).collect();
    let first = &nodes[graph[start]].def;
    SpecError::new(
        SpecErrorKind::Cycle,
        spec.sources.locate(&node_path(first, &["inputs"])),
        format!("cycle: {}", names.join(" → ")),
    )
}

#[cfg(test)]
mod tests {
    //! Node params in the key: resolved, with a fake op compiled in-process.
    use std::cell::Cell;

    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::dag::key::{diff, HashInputs};
    use crate::ops::{Op, OpError, RunContext};
    use crate::spec::LoadOptions;
    use serde_json::Value;

    thread_local! {
        /// The fake op's default clip range, as if its code changed between runs.
        static DEFAULT_CLIP: Cell<f64> = const { Cell::new(0.2) };
    }

    fn d_clip() -> f64 {
        DEFAULT_CLIP.with(Cell::get)
    }

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct ClipParams {
        /// A bound only the schema states (serde takes any f64).
        #[serde(default = "d_clip")]
        #[schemars(range(min = 0.0))]
        clip_eps: f64,
        #[serde(default)]
        seed: u64,
    }

    struct Clip;

    impl Op for Clip {
        fn name(&self) -> &'static str {
            "test.clip"
        }
        fn version(&self) -> u32 {
            1
        }
        fn summary(&self) -> &'static str {
            "a fake op with a default"
        }
        type Params = ClipParams;
        fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
            vec![OutputDecl::file("out")]
        }
        fn run(&self, _params: &Self::Params, _ctx: &RunContext<'_>) -> Result<(), OpError> {
            Ok(())
        }
    }

    /// The record of the only node of a one-node spec with these params.
    fn record(params: &str) -> HashInputs {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("spec.yaml");
        std::fs::write(&path, format!("name: t\nnodes:\n  n:\n    op: test.clip\n    params: {params}\n")).unwrap();
        let spec = crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads");
        let mut registry = Registry::builtin();
        registry.register(Arc::new(Clip));
        let dag = compile(&spec, &registry).expect("the spec compiles");
        let node = &dag.nodes[0];
        HashInputs {
            op: node.op.name().into(),
            op_version: node.op.version(),
            params: node.params.value().clone(),
            inputs: BTreeMap::new(),
            files: BTreeMap::new(),
            trees: BTreeMap::new(),
            params_files: BTreeMap::new(),
            interpreters: BTreeMap::new(),
            env: None,
        }
    }

    /// The program a command runs is keyed as a file dep where nothing
    /// keys it already: not again where a folder dep covers it, an edge
    /// where another node writes it, never the node's own out, nor a link.
    #[test]
    fn the_program_a_command_runs_is_a_file_dep_an_edge_or_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        for f in ["train.py", "src/train.py", "other.py"] {
            std::fs::create_dir_all(dir.path().join(f).parent().unwrap()).unwrap();
            std::fs::write(dir.path().join(f), "print(1)\n").unwrap();
        }
        std::os::unix::fs::symlink(dir.path().join("other.py"), dir.path().join("link.py")).unwrap();
        let node = |id: &str, cmd: &str, deps: &str, outs: &str| {
            format!("  {id}:\n    op: shell\n    params: {{cmd: '{cmd}', deps: [{deps}], outs: [{outs}]}}\n")
        };
        let text = [
            "name: t\nnodes:\n".to_string(),
            node("plain", "python3 train.py > a", "", "a"),
            node("covered", "python3 src/train.py > b", "src", "b"),
            node("gen", "echo print > gen.py", "", "gen.py"),
            node("generated", "python3 gen.py > c", "", "c"),
            node("own", "cp train.py own.py && python3 own.py > d", "", "own.py, d"),
            node("linked", "python3 link.py > e", "", "e"),
        ]
        .concat();
        let path = dir.path().join("spec.yaml");
        std::fs::write(&path, text).unwrap();
        std::fs::write(dir.path().join("own.py"), "print(2)\n").unwrap();
        let spec = crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads");
        let dag = compile(&spec, &Registry::builtin()).expect("the spec compiles");
        let at = |id: &str| &dag.nodes[dag.position(id).unwrap()];
        assert_eq!(at("plain").files, ["train.py"]);
        assert!(at("covered").files.is_empty(), "keyed twice: {:?}", at("covered").files);
        assert!(at("generated").files.is_empty());
        assert_eq!(dag.parents(dag.position("generated").unwrap()), [dag.position("gen").unwrap()]);
        assert!(
            at("generated").inputs.contains_key(&format!("{FILE_DEP_PREFIX}gen.py")),
            "{:?}",
            at("generated").inputs
        );
        assert!(at("own").files.is_empty() && at("own").inputs.is_empty());
        assert!(at("linked").files.is_empty());
    }

    /// `Dag::restrict` keeps the targets and what they read, as compiling
    /// the spec cut down to them gives: the same nodes, edges and order.
    #[test]
    fn a_dag_restricted_to_targets_is_the_dag_of_the_spec_cut_to_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("spec.yaml");
        let shell = |deps: &str, out: &str| {
            format!("    op: shell\n    params: {{cmd: 'true', deps: [{deps}], outs: [{out}]}}\n")
        };
        let text = format!(
            "name: t\nnodes:\n  a:\n{}  b:\n{}  c:\n{}  d:\n{}  e:\n{}",
            shell("", "a.txt"),
            shell("a.txt", "b.txt"),
            shell("b.txt", "c.txt"),
            shell("", "d.txt"),
            shell("a.txt, d.txt", "e.txt")
        );
        std::fs::write(&path, text).unwrap();
        let spec = crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads");
        let registry = Registry::builtin();
        let shape = |dag: &Dag| {
            let ids: Vec<&str> = dag.order.iter().map(|&p| dag.nodes[p].id()).collect();
            let mut edges: Vec<(String, String)> = (0..dag.nodes.len())
                .flat_map(|p| dag.parents(p).into_iter().map(move |q| (q, p)))
                .map(|(q, p)| (dag.nodes[q].id().to_string(), dag.nodes[p].id().to_string()))
                .collect();
            edges.sort();
            let inputs: Vec<_> = dag.order.iter().map(|&p| dag.nodes[p].inputs.clone()).collect();
            (ids.iter().map(|s| s.to_string()).collect::<Vec<_>>(), edges, inputs)
        };
        for targets in [vec!["b"], vec!["c", "d"], vec!["e"], vec!["a", "b", "c", "d", "e"]] {
            let named: BTreeSet<String> = targets.iter().map(|s| s.to_string()).collect();
            let cut = compile(&spec, &registry).unwrap().restrict(&named);
            // What the CLI did before: the spec cut down and compiled again.
            let full = compile(&spec, &registry).unwrap();
            let kept: BTreeSet<String> = shape(&cut).0.into_iter().collect();
            let mut small = spec.clone();
            small.nodes.retain(|n| kept.contains(&n.id));
            assert_eq!(shape(&cut), shape(&compile(&small, &registry).unwrap()), "{targets:?}");
            assert!(kept.iter().all(|id| full.position(id).is_some()));
            for p in 0..cut.nodes.len() {
                assert_eq!(cut.position(cut.nodes[p].id()), Some(p));
            }
        }
        let named: BTreeSet<String> = ["b".to_string()].into();
        let cut = compile(&spec, &registry).unwrap().restrict(&named);
        assert_eq!(shape(&cut).0, ["a", "b"]);
    }

    /// Nested outs (node `a` writes the folder `d`, node `b` the file
    /// `d/x.txt` in it) are refused, naming both: a dep inside them used to
    /// need a rule for which writer it reads. A dep inside one folder out
    /// reads that folder's writer, in every compile.
    #[test]
    fn nested_outs_are_refused_and_a_dep_inside_a_folder_out_reads_its_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("spec.yaml");
        let c = "  c:\n    op: shell\n    params: {cmd: 'cat d/x.txt', deps: [d/x.txt], outs: [c.txt]}\n";
        let a = "name: t\nnodes:\n  a:\n    op: shell\n    params: {cmd: 'mkdir -p d', outs: [d]}\n";
        let b = "  b:\n    op: shell\n    params: {cmd: 'echo > d/x.txt', outs: [d/x.txt]}\n";
        std::fs::write(&path, format!("{a}{b}{c}")).unwrap();
        let spec = crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads");
        let Err(e) = compile(&spec, &Registry::builtin()) else { panic!("nested outs compiled") };
        assert!(e.message.contains("'d' (node 'a') holds 'd/x.txt' (node 'b')"), "{e}");
        std::fs::write(&path, format!("{a}{c}")).unwrap();
        let spec = crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads");
        for _ in 0..20 {
            let dag = compile(&spec, &Registry::builtin()).expect("compiles");
            let c = dag.get("c").unwrap();
            let read: Vec<&str> = c.inputs.values().flatten().map(|r| r.node.as_str()).collect();
            assert_eq!(read, ["a"], "{:?}", c.inputs);
        }
    }

    #[test]
    fn writing_a_default_out_keeps_the_key() {
        let implicit = record("{seed: 1}");
        let explicit = record("{seed: 1, clip_eps: 0.2}");
        assert_eq!(implicit.key(), explicit.key());
        assert_eq!(implicit.params["clip_eps"], 0.2, "the key hashes the resolved value");
        assert_ne!(record("{seed: 1, clip_eps: 0.3}").key(), implicit.key());
    }

    #[test]
    fn changing_a_default_in_code_changes_the_key_and_the_diff_names_the_field() {
        let before = record("{seed: 1}");
        DEFAULT_CLIP.with(|d| d.set(0.28));
        let after = record("{seed: 1}");
        DEFAULT_CLIP.with(|d| d.set(0.2));
        assert_ne!(before.key(), after.key());
        let changes: Vec<String> = diff(&before, &after).iter().map(ToString::to_string).collect();
        assert_eq!(changes, ["params.clip_eps: 0.2 → 0.28"]);
    }

    #[test]
    fn every_builtin_op_resolves_its_own_resolution_to_itself() {
        // Resolving twice must be a no-op, or a re-compiled spec (a Slurm job's
        // exec-node) would compute another key than its coordinator.
        let samples: &[(&str, Value)] = &[
            (
                "shell",
                serde_json::json!({"cmd": "true", "outs": ["a"], "env": {"A": 1, "B": 1.5, "C": "x", "D": true}}),
            ),
            ("dataset.stock_arithmetic", serde_json::json!({"seed": 3})),
            ("tokenizer.build", serde_json::json!({})),
            ("model.init", serde_json::json!({})),
            ("train.sft", serde_json::json!({"branch": "sft", "epochs": 2})),
            ("train.grpo", serde_json::json!({})),
            ("check.resume", serde_json::json!({})),
            ("eval.generate", serde_json::json!({})),
            ("eval.score", serde_json::json!({})),
        ];
        let registry = Registry::builtin();
        for (name, params) in samples {
            let op = registry.get(name).expect("a builtin op");
            let once = op.parse(params).unwrap_or_else(|e| panic!("{name}: {e}")).value().clone();
            let twice = op.parse(&once).unwrap_or_else(|e| panic!("{name} (resolved): {e}")).value().clone();
            assert_eq!(once, twice, "{name}");
            assert!(once.as_object().is_some_and(|m| m.len() >= params.as_object().map_or(0, |p| p.len())), "{name}");
        }
    }

    /// Params that passed the schema check are noted in the parse cache and
    /// not checked again; any other params are, so an edit that breaks a
    /// bound is refused as without the cache.
    #[test]
    fn only_the_params_checked_before_skip_the_schema_check() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("spec.yaml");
        let mut registry = Registry::builtin();
        registry.register(Arc::new(Clip));
        let load = |clip: &str| {
            std::fs::write(
                &path,
                format!("name: t\nnodes:\n  a:\n    op: test.clip\n    params: {{clip_eps: {clip}}}\n"),
            )
            .unwrap();
            crate::spec::load(&path, &LoadOptions::default()).expect("the spec loads")
        };
        let ws = dir.path().join("ws");
        let bound = |e: SpecError| e.to_string().contains("params.clip_eps: -1 is less than the minimum of 0");

        let cache = ParseCache::new(&ws);
        let good = load("1");
        let name = cache.params_checked_name(&good.nodes).expect("this executable is known");
        compile_with(&good, &registry, Some(&cache)).expect("in bounds");
        assert_eq!(cache.save().unwrap(), 1, "the passed check is noted");
        let cache = ParseCache::new(&ws);
        assert!(cache.params_checked(&name));

        // Edited out of bounds: other params, checked, refused, and nothing noted.
        let bad = load("-1");
        let e = compile_with(&bad, &registry, Some(&cache)).err().expect("out of bounds");
        assert!(bound(e), "refused with the bound, as without the cache");
        assert_eq!(cache.save().unwrap(), 0, "a failed check is not noted");
        let bad_name = cache.params_checked_name(&bad.nodes).unwrap();
        assert_ne!(bad_name, name);
        let one_point_oh = load("1.0");
        assert_ne!(cache.params_checked_name(&one_point_oh.nodes).unwrap(), name, "the params as written");

        // The note is what skips the check: one noted (by hand) for the
        // out-of-bounds params is taken, as a parse entry would be.
        cache.remember_params_checked(bad_name, 1);
        cache.save().unwrap();
        compile_with(&bad, &registry, Some(&ParseCache::new(&ws))).expect("taken from the cache");
        assert!(bound(compile(&bad, &registry).err().unwrap()), "without the cache it is checked");
    }
}
