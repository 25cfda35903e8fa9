//! Data isolation, checked when a spec compiles: taints (which split's pages or
//! labels an artifact derives from) flow along every edge, and each node's role
//! says which taints it may read. Wiring test labels into training, or any
//! labels into inference, directly or through other nodes, is a compile error
//! that names the edge.

use std::collections::BTreeMap;

use super::{DagNode, FILE_DEP_PREFIX};
use crate::ops::Taint;
use crate::spec::{Spec, SpecError, SpecErrorKind};
use crate::store::fsx;

/// Taints of one output, each with the `NODE:OUTPUT` it originally came from.
type Taints = BTreeMap<Taint, String>;

/// A file some node reads as data, as the others see it: the pages and
/// labels it holds (each with how it came to hold them), and who imports it.
struct Source {
    taints: Taints,
    reader: String,
    /// `the file node 'data' imports as its test split`.
    said: String,
}

/// Every file a node reads as a split's data ([`crate::ops::AnyOp::data_sources`]), by path.
fn data_sources(nodes: &[DagNode]) -> BTreeMap<String, Vec<Source>> {
    let mut sources: BTreeMap<String, Vec<Source>> = BTreeMap::new();
    for node in nodes {
        for s in node.op.data_sources(&node.params) {
            let said = format!("the file node '{}' {}", node.def.id, s.how);
            let origin = format!("{}, {said}", s.path);
            let taints = s.taints.into_iter().map(|t| (t, origin.clone())).collect();
            sources.entry(s.path).or_default().push(Source { taints, reader: node.def.id.clone(), said });
        }
    }
    sources
}

/// How one dep of a node reaches files of the user's folder.
enum Dep<'a> {
    /// A file no node writes.
    File(&'a str),
    /// A folder no node writes, less what nodes write inside it.
    Dir(&'a str, &'a [String]),
    /// A glob's matches on disk.
    Glob(&'a [String]),
    /// A file or folder another node writes.
    Written(&'a str),
}

impl Dep<'_> {
    fn reads(&self, path: &str) -> bool {
        match self {
            Dep::File(f) => path == *f,
            Dep::Dir(dir, skip) => fsx::inside(path, dir) && !skip.iter().any(|s| s == path),
            Dep::Glob(matches) => matches.iter().any(|m| m == path),
            Dep::Written(dep) => fsx::at_or_inside(path, dep),
        }
    }
}

/// How a node names a file it reads: a dep, or a params file (whose keys'
/// values enter its command and its key: data as much as a dep's bytes).
#[derive(Clone, Copy)]
enum Named {
    Dep,
    ParamsFile,
    /// A path its command names, declared or not (`--data raw/te.jsonl`).
    Command,
}

impl Named {
    /// The node's field that names it, where an error points.
    fn field(self) -> &'static str {
        match self {
            Named::Dep => "deps",
            Named::ParamsFile => "params_files",
            Named::Command => "cmd",
        }
    }

    /// `dep 'raw' ('raw/te.jsonl', the file node 'data' imports as its test split)`.
    fn shown(self, dep: &str, path: &str, said: &str) -> String {
        let named = match self {
            Named::Dep => format!("dep '{dep}'"),
            Named::ParamsFile => format!("params file '{dep}'"),
            Named::Command => format!("'{dep}' named in its cmd"),
        };
        if dep == path {
            format!("{named}, {said}")
        } else {
            format!("{named} ('{path}', {said})")
        }
    }
}

/// One data file a node reads from the user's folder: as what, named how,
/// which file it reaches, and what that file holds.
struct RawRead<'a> {
    named: Named,
    dep: &'a str,
    path: &'a str,
    source: &'a Source,
}

/// The data files among what `node` reads from the user's folder (a file,
/// a folder holding one, a glob matching one, a dep another node writes, a
/// params file that is one, or a path its command names: `named`), with the
/// dep that reads each; the files it imports itself are left out.
fn raw_reads<'a>(
    node: &'a DagNode,
    named: &'a [String],
    sources: &'a BTreeMap<String, Vec<Source>>,
) -> Vec<RawRead<'a>> {
    if sources.is_empty() {
        return Vec::new();
    }
    let mut deps: Vec<(Named, &str, Dep<'_>)> =
        node.files.iter().map(|f| (Named::Dep, f.as_str(), Dep::File(f))).collect();
    for t in &node.trees {
        deps.push(match &t.kind {
            super::deps::TreeKind::Dir { skip } => (Named::Dep, t.name.as_str(), Dep::Dir(&t.name, skip)),
            super::deps::TreeKind::Glob { matches } => (Named::Dep, t.name.as_str(), Dep::Glob(matches)),
        });
    }
    for dep in node.inputs.keys().filter_map(|i| i.strip_prefix(FILE_DEP_PREFIX)) {
        deps.push((Named::Dep, dep, Dep::Written(dep)));
    }
    for (file, _) in &node.params_files {
        deps.push((Named::ParamsFile, file.as_str(), Dep::File(file)));
    }
    // A path the command names reaches a file as a dep another node writes
    // does: that file, or the files inside that folder.
    for path in named {
        deps.push((Named::Command, path.as_str(), Dep::Written(path)));
    }
    // A path the command names may be what it writes: the node's own outs
    // (`python3 make.py data` writing data/test.jsonl) are not what it reads.
    let own = |path: &str| {
        node.outputs.iter().filter_map(|o| o.workspace_path.as_deref()).any(|w| fsx::at_or_inside(path, w))
    };
    let mut out = Vec::new();
    for (named, dep, reach) in &deps {
        let written_here = |path: &str| matches!(named, Named::Command) && own(path);
        for (path, list) in sources.iter().filter(|(path, _)| reach.reads(path) && !written_here(path)) {
            out.extend(list.iter().filter(|s| s.reader != node.def.id).map(|source| RawRead {
                named: *named,
                dep,
                path: path.as_str(),
                source,
            }));
        }
    }
    out
}

/// The error for a node that reads what its role forbids: `why`, then
/// `what` it reads and how, located at `path` under the node.
fn leak(spec: &Spec, node: &DagNode, path: &[&str], why: &str, what: String) -> SpecError {
    let mut at: Vec<String> = vec!["nodes".into(), node.def.base_id.clone()];
    at.extend(path.iter().map(|s| s.to_string()));
    let role = node.op.role(&node.params);
    SpecError::new(
        SpecErrorKind::DataIsolation,
        spec.sources.locate_value(&at),
        format!("{why}: node '{}' ({}, role {}) reads {what}", node.def.id, node.op.name(), role.as_str()),
    )
}

/// Data some roles may not read, which a file a node reads could hold a
/// copy of under another path: the path-based check below cannot see such a
/// copy, so the keyed files of a node whose role forbids one of `taints` are
/// compared by content with it ([`crate::exec::node`]) whenever it is keyed.
/// One list per DAG, shared by its nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Guarded {
    pub data: GuardedData,
    pub taints: Vec<Taint>,
    /// The node that may read it whatever its role: the import that reads
    /// the file, the node that wrote the output.
    pub owner: String,
}

impl Guarded {
    /// The first of its taints `role` forbids, and why (`None`: it may read it).
    pub fn forbidden_to(&self, node: &str, role: crate::ops::Role) -> Option<(Taint, &'static str)> {
        if self.owner == node {
            return None;
        }
        self.taints.iter().find_map(|&t| role.forbids(t).map(|why| (t, why)))
    }
}

/// Where guarded data is.
#[derive(Debug, Clone, PartialEq)]
pub enum GuardedData {
    /// A file of the spec's folder an import reads (`raw/te.jsonl`), and how
    /// (`the file node 'data' imports as its test split`).
    File { path: String, said: String },
    /// A node's stored output (`data:labels.test`) in any of its results
    /// cached under spec `spec`.
    Output { spec: String, node: String, output: String },
}

impl std::fmt::Display for GuardedData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardedData::File { path, said } => write!(f, "'{path}', {said}"),
            GuardedData::Output { node, output, .. } => write!(f, "'{node}:{output}'"),
        }
    }
}

/// Every raw data file and every output that carries a split's data: one
/// list, as long as the DAG's data, whatever the number of nodes.
fn guarded(spec: &str, sources: &BTreeMap<String, Vec<Source>>, outputs: &OutputTaints) -> Vec<Guarded> {
    let mut out = Vec::new();
    for (path, list) in sources {
        for s in list {
            let data = GuardedData::File { path: path.clone(), said: s.said.clone() };
            out.push(Guarded { data, taints: s.taints.keys().copied().collect(), owner: s.reader.clone() });
        }
    }
    for ((producer, output), taints) in outputs.iter().filter(|(_, t)| !t.is_empty()) {
        let data = GuardedData::Output { spec: spec.to_string(), node: producer.clone(), output: output.clone() };
        out.push(Guarded { data, taints: taints.keys().copied().collect(), owner: producer.clone() });
    }
    out
}

type OutputTaints = BTreeMap<(String, String), Taints>;

/// Checks every node's reads against its role (an error names the first
/// edge that breaks one), and returns the data a file a node reads could
/// copy ([`Guarded`]).
pub fn check(spec: &Spec, nodes: &[DagNode], order: &[usize]) -> Result<Vec<Guarded>, SpecError> {
    let sources = data_sources(nodes);
    let mut outputs: OutputTaints = BTreeMap::new();
    for &pos in order {
        let node = &nodes[pos];
        let role = node.op.role(&node.params);
        let mut read: Taints = BTreeMap::new();
        for RawRead { named, dep, path, source } in raw_reads(node, &node.named, &sources) {
            for (taint, origin) in &source.taints {
                if let Some(why) = role.forbids(*taint) {
                    let shown = named.shown(dep, path, &source.said);
                    return Err(leak(spec, node, &["params", named.field()], why, format!("{taint} through {shown}")));
                }
                read.entry(*taint).or_insert_with(|| origin.clone());
            }
        }
        for (input, refs) in &node.inputs {
            for r in refs {
                let taints = outputs.get(&(r.node.clone(), r.output.clone())).cloned().unwrap_or_default();
                for (taint, origin) in taints {
                    if let Some(why) = role.forbids(taint) {
                        let through = if origin == r.to_string() {
                            String::new()
                        } else {
                            format!(" (which derives from '{origin}')")
                        };
                        // An edge no dep declares, to a path the command names.
                        let in_cmd = |dep: &str| {
                            let declared = node.op.file_deps(&node.params, &spec.base_dir);
                            !declared.iter().any(|d| crate::store::fsx::at_or_inside(dep, d) || d.contains('*'))
                                && node.named.iter().any(|p| p == dep)
                        };
                        let (path, shown) = match input.strip_prefix(FILE_DEP_PREFIX) {
                            Some(dep) if in_cmd(dep) => (vec!["params", "cmd"], format!("'{dep}' named in its cmd")),
                            Some(dep) => (vec!["params", "deps"], format!("dep '{dep}'")),
                            None => (vec!["inputs", input.as_str()], format!("input '{input}'")),
                        };
                        return Err(leak(spec, node, &path, why, format!("{taint} through {shown} ← '{r}'{through}")));
                    }
                    read.entry(taint).or_insert(origin);
                }
            }
        }
        for out in &node.outputs {
            let taints = match &out.taint {
                Some(declared) => {
                    let mut t: Taints = if out.inherits { read.clone() } else { Taints::new() };
                    for d in declared {
                        t.entry(*d).or_insert_with(|| format!("{}:{}", node.def.id, out.name));
                    }
                    t
                }
                None => read.clone(),
            };
            outputs.insert((node.def.id.clone(), out.name.clone()), taints);
        }
    }
    Ok(guarded(&spec.name, &sources, &outputs))
}
