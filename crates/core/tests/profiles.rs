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
    let p: ModelInitParams = parse_params(&serde_json::Value::Object(base.params.clone())).unwrap();
    let config = p.config(1024, 3).unwrap();
    assert_eq!(config.vocab_size, 151_936);
    assert_eq!(config.parameter_count(), 494_032_768);
    // A vocabulary below the tokenizer's is refused, naming the field.
    let e = ModelInitParams { vocab_size: Some(100), ..p }.config(1024, 3).unwrap_err();
    assert!(e.contains("params.vocab_size 100") && e.contains("1024"), "{e}");
}
