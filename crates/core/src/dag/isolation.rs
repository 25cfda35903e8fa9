//! Data isolation, checked when a spec compiles: taints (which split's pages or
//! labels an artifact derives from) flow along every edge, and each node's role
//! says which taints it may read. Wiring test labels into training, or any
//! labels into inference, directly or through other nodes, is a compile error
//! that names the edge.

use std::collections::BTreeMap;

use super::{DagNode, FILE_DEP_PREFIX};
use crate::ops::Taint;
use crate::spec::{Spec, SpecError, SpecErrorKind};

/// Taints of one output, each with the `NODE:OUTPUT` it originally came from.
type Taints = BTreeMap<Taint, String>;

pub fn check(spec: &Spec, nodes: &[DagNode], order: &[usize]) -> Result<(), SpecError> {
    let mut outputs: BTreeMap<(String, String), Taints> = BTreeMap::new();
    for &pos in order {
        let node = &nodes[pos];
        let role = node.op.role(&node.params);
        let mut read: Taints = BTreeMap::new();
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
                        let (path, shown) = match input.strip_prefix(FILE_DEP_PREFIX) {
                            Some(dep) => (vec!["params", "deps"], format!("dep '{dep}'")),
                            None => (vec!["inputs", input.as_str()], format!("input '{input}'")),
                        };
                        let mut at: Vec<String> = vec!["nodes".into(), node.def.base_id.clone()];
                        at.extend(path.iter().map(|s| s.to_string()));
                        return Err(SpecError::new(
                            SpecErrorKind::DataIsolation,
                            spec.sources.locate_value(&at),
                            format!(
                                "{why}: node '{}' ({}, role {}) reads {taint} through {shown} ← '{r}'{through}",
                                node.def.id,
                                node.op.name(),
                                role.as_str()
                            ),
                        ));
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
    Ok(())
}
