//! `gate`: evaluates a gate file over node outputs. The file is a declared dep
//! (editing a criterion re-evaluates the gate and re-runs nothing else), and the
//! evidence it names becomes the node's inputs. A failing gate is a result, not
//! an error: the node succeeds, records FAIL with the evidence's hashes, and
//! `orchestrate run` exits 1.

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Op, OpError, OutputDecl, ParamError, Role, RunContext};
use crate::gate::{evaluate, read_gate_file, table};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateParams {
    /// The gate file, relative to the spec's folder (e.g. ../gates/grpo-main.yaml),
    /// inside the spec's project: the nearest folder above it holding `.git`, else
    /// the folder orchestrate runs in when that holds the spec, else the spec's folder.
    pub file: String,
}

pub struct GateOp;

/// Reads evidence with the one reader of structured files: by the output's
/// extension (a shell node's `metrics.yaml` or `metrics.toml`), JSON otherwise.
pub fn parse_evidence(reference: &str, text: &str) -> Result<Value, crate::gate::GateError> {
    let format = crate::docfile::Format::of(reference).unwrap_or(crate::docfile::Format::Json);
    crate::docfile::parse(format, text)
        .map_err(|source| crate::gate::GateError::Evidence { reference: reference.to_string(), source })
}

/// The input name an evidence reference becomes.
pub fn evidence_input(reference: &str) -> String {
    format!("evidence:{reference}")
}

impl GateOp {
    /// The op's name in specs.
    pub const NAME: &'static str = "gate";
    /// The output that holds its [`crate::gate::GateReport`].
    pub const REPORT: &'static str = "gates.json";
}

impl Op for GateOp {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn version(&self) -> u32 {
        // 2: `equals` compares numbers by value (0.0 equals 0), and evidence
        // holding NaN or an infinity is read (a gate over it fails saying so)
        // instead of failing the node: the same inputs give other results.
        // 3: a field path's double-quoted segment names a key whole
        // (`m."eval.acc"`), an empty segment is refused, and NaN equals
        // nothing in `equals_field` (two NaNs compared equal).
        3
    }
    fn summary(&self) -> &'static str {
        "evaluates pre-registered gates (gates/*.yaml) over node outputs"
    }
    type Params = GateParams;
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<super::InputDecl>> {
        Some(Vec::new())
    }
    fn implied_inputs(&self, params: &Self::Params, spec_dir: &Path) -> Result<Vec<(String, String)>, ParamError> {
        let at_file = |e: crate::gate::GateError| ParamError {
            path: vec!["file".into()],
            message: e.to_string(),
            unknown_key: false,
        };
        let path = crate::gate::gate_file_path(spec_dir, &params.file).map_err(at_file)?;
        let file = read_gate_file(&path).map_err(at_file)?;
        let mut refs: Vec<String> = file.gates.iter().flat_map(|g| g.evidence.values().cloned()).collect();
        refs.sort();
        refs.dedup();
        Ok(refs.into_iter().map(|r| (evidence_input(&r), r)).collect())
    }
    fn file_deps(&self, params: &Self::Params, _spec_dir: &Path) -> Vec<String> {
        vec![params.file.clone()]
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl::file(Self::REPORT), OutputDecl::file("gates.md")]
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Scoring
    }
    fn printed_output(&self) -> Option<&'static str> {
        Some("gates.md")
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let failed = |e: crate::gate::GateError| OpError::Failed(e.to_string());
        let path = crate::gate::gate_file_path(ctx.spec_dir, &p.file).map_err(failed)?;
        // The bytes the key holds, read once: an edit during the run is an
        // error, never a verdict of other criteria under this key.
        let bytes = ctx.read_keyed_file(&p.file, &path, crate::gate::MAX_GATE_FILE_BYTES)?;
        let text = String::from_utf8(bytes)
            .map_err(|e| OpError::Failed(format!("{}: not UTF-8 text: {}", path.display(), e.utf8_error())))?;
        let file = crate::gate::parse_gate_file(&path, &text).map_err(failed)?;
        // The evidence became this node's inputs when the spec compiled; a
        // file edited since may name other evidence.
        for r in file.gates.iter().flat_map(|g| g.evidence.values()) {
            if !ctx.inputs.contains_key(&evidence_input(r)) {
                return Err(OpError::Failed(format!(
                    "{}: the gate file names evidence {r}, which was not among this node's inputs when the spec \
                     compiled (the file changed during the run); run again",
                    path.display()
                )));
            }
        }
        // Each reference's value, or why it is not read: evidence over the
        // bound an audit reads fails its gates here as it does there.
        let mut loaded: BTreeMap<String, (Result<Value, String>, String)> = BTreeMap::new();
        for (name, artifacts) in ctx.inputs {
            let Some(reference) = name.strip_prefix("evidence:") else { continue };
            let a = &artifacts[0];
            let value = match crate::fsread::read_bounded_text(&a.path, crate::gate::MAX_EVIDENCE_BYTES) {
                Ok(text) => Ok(parse_evidence(reference, &text).map_err(|e| OpError::Failed(e.to_string()))?),
                Err(crate::fsread::BoundedFileError::TooLarge { .. }) => {
                    Err(crate::gate::evidence_too_large(reference))
                }
                Err(e) => return Err(OpError::Failed(format!("reading evidence {reference}: {e}"))),
            };
            loaded.insert(reference.to_string(), (value, a.hash.clone()));
        }
        let results: Vec<_> = file
            .gates
            .iter()
            .map(|g| {
                let hashes =
                    g.evidence.iter().map(|(alias, r)| (alias.clone(), (r.clone(), loaded[r].1.clone()))).collect();
                let evidence: Result<BTreeMap<_, _>, _> = g
                    .evidence
                    .iter()
                    .map(|(alias, r)| loaded[r].0.as_ref().map(|v| (alias.clone(), v.clone())))
                    .collect();
                match evidence {
                    Ok(evidence) => evaluate(g, &evidence, &hashes),
                    Err(detail) => crate::gate::GateResult::unevaluated(g, detail.clone(), hashes),
                }
            })
            .collect();
        let report = crate::gate::GateReport::new(file.name.clone(), results.clone());
        ctx.write_output("gates.json", serde_json::to_string_pretty(&report).unwrap_or_default() + "\n")?;
        ctx.write_output("gates.md", table(&results))
    }
}
