//! The embedded default's tokenizer pre-tokenizes as Qwen2's does: the same
//! ids as transformers' slow, pure-Python Qwen2Tokenizer (its own regex, NFC
//! and byte-level BPE) given the same vocabulary and merges.

use std::path::Path;
use std::process::Command;

use orchestrate_core::model::{build_bpe, TextTokenizer};

#[test]
fn our_tokenizer_encodes_as_transformers_qwen2_tokenizer_does() {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let dir = tempfile::tempdir().unwrap();
    let corpus: Vec<String> = (0..300)
        .map(|i| {
            format!(
                "A warehouse holds {} boxes. It's restocked twice: +{} and -{}.\n{{\"final_stock\": {}}}",
                i * 7 % 997,
                i % 50,
                i % 13,
                i * 7 % 997 + i % 50 - i % 13
            )
        })
        .collect();
    let path = dir.path().join("tokenizer.json");
    build_bpe(&corpus, 400, &path).unwrap();
    let texts = vec![
        "<|im_start|>user\nA warehouse holds 1234 boxes. Deliveries: 56, 7 and 890.<|im_end|>\n".to_string(),
        "{\"final_stock\": 10020}".to_string(),
        "We've 3.14159 boxes, they're   spaced\tout\r\n\n  and 2024-12-01".to_string(),
        "Ünïcödé cafe\u{301} ½ ٣٤ 12345678901234567890".to_string(),
        "<|im_start|>assistant\n{\"final_stock\": 77}<|im_end|>".to_string(),
    ];
    std::fs::write(dir.path().join("texts.json"), serde_json::to_string(&texts).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/qwen2_slow_tokenizer.py");
    let out = Command::new(python).arg(&script).arg(&path).arg(dir.path().join("texts.json")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokenizer = TextTokenizer::from_file(&path).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let ours = tokenizer.encode(text).unwrap();
        let expected: Vec<i64> = serde_json::from_value(theirs["ids"][i].clone()).unwrap();
        assert_eq!(ours, expected, "text {i}: {text:?}");
    }
}
