//! The specs' profiles that promise a shape hold it.

use orchestrate_core::ops::{parse_params, ModelInitParams};
use orchestrate_core::spec::{load, LoadOptions};

/// The shapes-0.5b profile builds Qwen2.5-0.5B-Instruct's exact shape: the
/// parameter count its model card and `model.import` check (tied embeddings).
#[test]
fn the_shapes_profile_is_qwen2_5_0_5b_to_the_parameter() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/grpo-main.yaml");
    let opts = LoadOptions { profile: Some("shapes-0.5b".into()), ..Default::default() };
    let spec = load(&spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let base = spec.node("base").unwrap();
    assert_eq!(base.op, "model.init");
    let p: ModelInitParams = parse_params(&base.params).unwrap();
    let config = p.config(1024, 3).unwrap();
    assert_eq!(config.vocab_size, 151_936);
    assert_eq!(config.parameter_count(), 494_032_768);
    // A vocabulary below the tokenizer's is refused, naming the field.
    let e = ModelInitParams { vocab_size: Some(100), ..p }.config(1024, 3).unwrap_err().to_string();
    assert!(e.contains("params.vocab_size 100") && e.contains("1024"), "{e}");
}

/// An artifact kind names an output its op declares, on every node of the
/// main spec (so a reader never asks for a name no node has), and each kind is
/// written by some node there.
#[test]
fn each_artifact_kind_is_an_output_its_ops_nodes_declare() {
    use orchestrate_core::ops::artifacts::{ArtifactKind, NodeKind};
    let registry = orchestrate_core::ops::Registry::builtin();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/grpo-main.yaml");
    let spec = load(&path, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let kinds = [
        ArtifactKind::TrainingMetrics,
        ArtifactKind::EvalSummary,
        ArtifactKind::EvalResults,
        ArtifactKind::ResultsTable,
        ArtifactKind::GateReport,
        ArtifactKind::Rollouts,
    ];
    let mut written = std::collections::BTreeSet::new();
    for node in &spec.nodes {
        let op = registry.get(&node.op).unwrap();
        let params = op.parse(&node.params).unwrap();
        let declared: Vec<String> = op.outputs(&params).into_iter().map(|o| o.name).collect();
        for kind in kinds {
            if let Some(name) = kind.output_of(&node.op) {
                assert!(declared.iter().any(|d| d == name), "{}: {} declares no {name}", node.id, node.op);
                written.insert(format!("{kind:?}"));
            }
        }
    }
    assert_eq!(written.len(), kinds.len(), "kinds written in the main spec: {written:?}");
    assert_eq!(NodeKind::of("shell"), NodeKind::Command);
    assert_eq!(NodeKind::of("dataset.import"), NodeKind::Other);
}
