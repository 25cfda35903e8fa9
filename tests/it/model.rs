//! The model ops and `orchestrate generate`, through the binaries.

use crate::common;

use common::{nodes_with, stderr, stdout, Project};

const TINY: &str = r#"
name: tiny
nodes:
  data:
    op: dataset.stock_arithmetic
    params: {seed: 0, train: 200, validation: 20, test_id50: 10, test_ood100: 10, warmstart: 16}
  tokenizer:
    op: tokenizer.build
    inputs: {pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {vocab_size: 512}
  model:
    op: model.init
    inputs: {tokenizer: 'tokenizer:tokenizer'}
    params: {seed: 0, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2}
"#;

fn built() -> (Project, String) {
    let p = Project::new();
    p.write("tiny.yaml", TINY);
    let ev = p.run_json(&["tiny.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["data", "model", "tokenizer"]);
    let out = p.run(&["path", "tiny.yaml", "model:model"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = stdout(&out).trim().to_string();
    (p, dir)
}

fn generate_json(p: &Project, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["generate", "--json"];
    full.extend_from_slice(args);
    let out = p.run(&full);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The shared type, field for field (unknown fields refused).
    let typed: orchestrate_core::model::GenerateResponse = serde_json::from_str(stdout(&out).trim()).unwrap();
    serde_json::to_value(typed).unwrap()
}

#[test]
fn the_embedded_default_builds_in_hf_layout_and_reruns_from_cache() {
    let (p, dir) = built();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"] {
        assert!(std::path::Path::new(&dir).join(f).is_file(), "{f} in {dir}");
    }
    let ev = p.run_json(&["tiny.yaml"], 0);
    assert_eq!(nodes_with(&ev, "cache_hit"), ["data", "model", "tokenizer"]);
    // The numerical node's key includes the environment; the others do not.
    let explain: serde_json::Value =
        serde_json::from_str(&stdout(&p.run(&["explain", "tiny.yaml", "model", "--json"]))).unwrap();
    assert_eq!(explain["record"]["env"]["device"], "cpu");
    assert!(explain["record"]["env"]["libtorch"].as_str().unwrap().starts_with("2.11.0"));
    let explain: serde_json::Value =
        serde_json::from_str(&stdout(&p.run(&["explain", "tiny.yaml", "tokenizer", "--json"]))).unwrap();
    assert!(explain["record"]["env"].is_null());
}

/// `run` ends with what each measuring node's process cost, as its record
/// keeps them: the training node (its worker measured it), not the others;
/// and a run of nodes that measure nothing prints no such table.
#[test]
fn run_prints_the_costs_the_numerical_nodes_measured() {
    let (p, _) = built();
    let sft = "  sft:\n    op: train.sft\n    inputs: {model: 'model:model', pages: 'data:pages.train', labels: 'data:labels.train', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation'}\n    params: {branch: warmstart, epochs: 1, batch_size: 4, lr: 1e-3}\n";
    p.write("tiny.yaml", &format!("{TINY}{sft}"));
    let out = p.run(&["run", "tiny.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("| sft | train.sft |") && stdout(&out).contains("| this run |"), "{}", stdout(&out));
    // The node's headline figures, as its worker reported them, are those of
    // its `metrics` output (read here on its own): printed as it finished, and
    // kept in its node_finished event.
    let metrics = p.run(&["path", "tiny.yaml", "sft:metrics"]);
    assert_eq!(metrics.status.code(), Some(0), "{}", stderr(&metrics));
    let metrics: serde_json::Value = serde_json::from_slice(&std::fs::read(stdout(&metrics).trim()).unwrap()).unwrap();
    let history = metrics["history"].as_array().unwrap();
    let loss = |i: usize| history[i]["loss"].as_f64().unwrap();
    let line = format!(
        "loss {:.4} -> {:.4} over {} updates, validation NLL {:.4}",
        loss(0),
        loss(history.len() - 1),
        history.len(),
        metrics["validation_history"][0]["validation_nll"].as_f64().unwrap()
    );
    let done =
        stderr(&out).lines().chain(stdout(&out).lines()).find(|l| l.starts_with("done     sft ")).map(str::to_string);
    assert!(done.as_deref().is_some_and(|l| l.ends_with(&format!(": {line}"))), "{done:?}, expected it to end: {line}");
    let events = p.run(&["events", "--json"]);
    let finished: Vec<serde_json::Value> = stdout(&events)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["source"] == "engine" && e["type"] == "node_finished")
        .collect();
    let summary = |node: &str| finished.iter().find(|e| e["node"] == node).map(|e| e["event"]["summary"].clone());
    assert_eq!(summary("sft").unwrap()["updates"].as_u64(), Some(history.len() as u64), "{finished:?}");
    assert_eq!(summary("sft").unwrap()["last_loss"].as_f64(), Some(loss(history.len() - 1)));
    let out = p.run(&["run", "tiny.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let table = text.split("costs (").nth(1).unwrap_or_else(|| panic!("a costs table in: {text}"));
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| node ")).collect();
    assert_eq!(rows.len(), 1, "{table}");
    let cells: Vec<&str> = rows[0].trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!((cells[0], cells[1], cells[4]), ("sft", "train.sft", "cached"), "{}", rows[0]);
    assert!(cells[2].parse::<f64>().is_ok_and(|s| s > 0.0), "seconds: {}", rows[0]);
    p.write("plain.yaml", "name: plain\nnodes:\n  a: {op: shell, params: {cmd: 'echo a > a.txt', outs: [a.txt]}}\n");
    for _ in 0..2 {
        let out = p.run(&["run", "plain.yaml"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(!stdout(&out).contains("costs ("), "{}", stdout(&out));
    }
}

#[test]
fn the_same_seed_gives_the_same_weights() {
    let (_a, dir_a) = built();
    let (_b, dir_b) = built();
    let a = std::fs::read(format!("{dir_a}/model.safetensors")).unwrap();
    let b = std::fs::read(format!("{dir_b}/model.safetensors")).unwrap();
    assert!(a == b, "model.init is deterministic");
}

#[test]
fn generate_applies_the_chat_format_and_reports_ids_logprobs_and_finish() {
    let (p, dir) = built();
    let v = generate_json(
        &p,
        &["--model", &dir, "--prompt", "A warehouse holds 5 boxes.", "--seed", "3", "--max-new-tokens", "10"],
    );
    let ids = v["ids"].as_array().unwrap();
    assert!(!ids.is_empty() && ids.len() <= 10);
    assert_eq!(v["behavior_logprobs"].as_array().unwrap().len(), ids.len());
    assert!(["eos", "length"].contains(&v["finish_reason"].as_str().unwrap()));
    // The ChatML prompt: it starts with <|im_start|> and ends with the generation prompt.
    let prompt: Vec<i64> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    assert_eq!(prompt[0], 1, "<|im_start|> is the second special token");
    // Same seed and rollout: the same draw. Another rollout id: another draw.
    let again = generate_json(
        &p,
        &["--model", &dir, "--prompt", "A warehouse holds 5 boxes.", "--seed", "3", "--max-new-tokens", "10"],
    );
    assert_eq!(v["ids"], again["ids"]);
    let other = generate_json(
        &p,
        &[
            "--model",
            &dir,
            "--prompt",
            "A warehouse holds 5 boxes.",
            "--seed",
            "3",
            "--rollout-id",
            "1",
            "--max-new-tokens",
            "10",
        ],
    );
    assert_ne!(v["ids"], other["ids"]);
    // Raw ids are fed untouched.
    let raw = generate_json(&p, &["--model", &dir, "--prompt-ids", "1,5,6,7", "--greedy", "--max-new-tokens", "4"]);
    assert_eq!(raw["prompt_ids"], serde_json::json!([1, 5, 6, 7]));
    // The KV cache and full recomputation agree.
    let cached = generate_json(&p, &["--model", &dir, "--prompt-ids", "1,5,6,7", "--greedy", "--max-new-tokens", "8"]);
    let full = generate_json(
        &p,
        &["--model", &dir, "--prompt-ids", "1,5,6,7", "--greedy", "--max-new-tokens", "8", "--no-cache"],
    );
    assert_eq!(cached["ids"], full["ids"]);
}

#[test]
fn an_over_budget_prompt_is_an_error_not_a_truncation() {
    let (p, dir) = built();
    let long = "boxes ".repeat(300);
    let out = p.run(&["generate", "--model", &dir, "--prompt", &long]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("over the budget of 256") && stderr(&out).contains("nothing is truncated"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_model_folder_says_how_to_get_the_weights() {
    let p = Project::new();
    let out = p.run(&["generate", "--model", "no/such/qwen", "--prompt", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("no/such/qwen: no such folder") && err.contains("huggingface-cli download"), "{err}");
}

/// A Hugging Face cache snapshot is links into the cache's blobs, and
/// `model.import` reads no link (a spec could otherwise copy any file a link
/// reaches into the store, and `push` would share it). The docs said the
/// folder's files were read through links; the error said only "a symbolic
/// link or a special file". It now says what to use instead: `model.hub`,
/// which reads that cache (offline too), or a `--local-dir` download.
#[test]
fn model_import_of_a_cache_snapshot_of_links_says_to_use_model_hub() {
    let p = Project::new();
    std::fs::create_dir_all(p.path().join("blobs")).unwrap();
    std::fs::create_dir_all(p.path().join("snap")).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        p.write(&format!("blobs/{f}"), "{}");
        std::os::unix::fs::symlink(format!("../blobs/{f}"), p.path().join("snap").join(f)).unwrap();
    }
    p.write("import.yaml", "name: imp\nnodes:\n  qwen:\n    op: model.import\n    params: {path: snap}\n");
    let out = p.run(&["validate", "import.yaml"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("symbolic link") && err.contains("model.hub") && err.contains("--local-dir"), "{err}");
}

#[test]
fn model_import_checks_the_parameter_count_and_copies_the_folder() {
    let (p, dir) = built();
    let local = p.path().join("weights");
    std::fs::create_dir_all(&local).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(format!("{dir}/{f}"), local.join(f)).unwrap();
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(local.join("config.json")).unwrap()).unwrap();
    let (v, h, i, l) = (
        config["vocab_size"].as_u64().unwrap(),
        config["hidden_size"].as_u64().unwrap(),
        config["intermediate_size"].as_u64().unwrap(),
        config["num_hidden_layers"].as_u64().unwrap(),
    );
    // 4 heads of 16, 2 kv heads: q 64x64+64, k and v 64x32+32 each, o 64x64; mlp 3x64x128; 2 norms.
    let per_layer = (h * h + h) + 2 * (h * 32 + 32) + h * h + 3 * h * i + 2 * h;
    let expected = v * h + l * per_layer + h;
    p.write(
        "import.yaml",
        &format!(
            "name: imp\nnodes:\n  qwen:\n    op: model.import\n    params: {{path: weights, parameters: {expected}}}\n"
        ),
    );
    assert_eq!(nodes_with(&p.run_json(&["import.yaml"], 0), "node_finished"), ["qwen"]);
    assert_eq!(nodes_with(&p.run_json(&["import.yaml"], 0), "cache_hit"), ["qwen"]);

    let wrong = expected + 1;
    let ev = p.run_json(&["import.yaml", "--set", &format!("nodes.qwen.params.parameters={wrong}")], 1);
    let failed = ev.iter().find(|e| e["event"] == "node_failed").unwrap();
    assert!(
        failed["error"].as_str().unwrap().contains(&format!("{expected} parameters, expected {wrong}")),
        "{failed}"
    );

    // Editing a weight file changes the key: the import re-runs.
    let mut bytes = std::fs::read(local.join("model.safetensors")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(local.join("model.safetensors"), bytes).unwrap();
    let ev = p.run_json(&["import.yaml"], 0);
    assert_eq!(nodes_with(&ev, "node_finished"), ["qwen"]);

    // From another folder the spec's relative path still means the same files.
    let elsewhere = tempfile::tempdir().unwrap();
    let spec = p.path().join("import.yaml");
    let ws = p.path().join(".orchestrate");
    let out = std::process::Command::new(common::bin())
        .args(["--workspace", ws.to_str().unwrap(), "plan", spec.to_str().unwrap(), "--json"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(plan["state"], "cached", "{plan}");
}

#[test]
fn declared_inputs_are_checked_when_the_spec_compiles() {
    let p = Project::new();
    p.write(
        "a.yaml",
        &TINY.replace("inputs: {tokenizer: 'tokenizer:tokenizer'}", "inputs: {tokeniser: 'tokenizer:tokenizer'}"),
    );
    let out = p.run(&["validate", "a.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("has no input 'tokeniser' (did you mean 'tokenizer'?)"), "{}", stderr(&out));
    p.write(
        "b.yaml",
        &TINY.replace(
            "    inputs: {pages: 'data:pages.train', labels: 'data:labels.train'}\n",
            "    inputs: {pages: 'data:pages.train'}\n",
        ),
    );
    let out = p.run(&["validate", "b.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("needs input 'labels'"), "{}", stderr(&out));
    // The tokenizer trains on train data only.
    p.write("c.yaml", &TINY.replace("pages: 'data:pages.train'", "pages: 'data:pages.test'"));
    let out = p.run(&["validate", "c.yaml"]);
    assert!(stderr(&out).contains("a training node may not read test data"), "{}", stderr(&out));
}

/// The embedded default's tokenizer, with `extra` special tokens added (a
/// Llama-3 template's header tokens), written to `dir/tokenizer.json`.
fn tokenizer_with(model_dir: &str, extra: &[&str], dir: &std::path::Path) -> std::path::PathBuf {
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(model_dir).join("tokenizer.json")).unwrap())
            .unwrap();
    let vocab = t["model"]["vocab"].as_object().unwrap().len() as u64;
    let added = t["added_tokens"].as_array().unwrap();
    let first = vocab.max(added.iter().map(|a| a["id"].as_u64().unwrap() + 1).max().unwrap_or(0));
    for (next, token) in (first..).zip(extra) {
        t["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
            "id": next, "content": token, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true
        }));
    }
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, t.to_string()).unwrap();
    path
}

#[test]
fn chat_templates_render_the_token_ids_transformers_renders() {
    use orchestrate_core::model::chat::{ChatTemplate, CHATML_TEMPLATE};
    use orchestrate_core::model::TextTokenizer;
    let (_p, model_dir) = built();
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
    let dir = tempfile::tempdir().unwrap();
    let cases = serde_json::json!([
        ["You are a helpful assistant.", "What is 2+2?"],
        ["", "  Tom has 3 apples.\nHe buys {x} more — how many?  "],
        ["Réponds en JSON.", "Café, 3½ boxes, <b>bold</b>, \"quotes\" and a trailing newline\n"],
    ]);
    let cases_file = dir.path().join("cases.json");
    std::fs::write(&cases_file, cases.to_string()).unwrap();
    let chatml = dir.path().join("chatml.jinja");
    std::fs::write(&chatml, CHATML_TEMPLATE).unwrap();
    let llama_tokens = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
    let llama_dir = dir.path().join("llama");
    std::fs::create_dir(&llama_dir).unwrap();
    let plain = std::path::Path::new(&model_dir).join("tokenizer.json");
    let templates = [
        ("Qwen2.5-Instruct", fixtures.join("qwen2.5-instruct.jinja"), plain.clone(), "", "<|im_end|>"),
        (
            "Llama-3-Instruct",
            fixtures.join("llama-3-instruct.jinja"),
            tokenizer_with(&model_dir, &llama_tokens, &llama_dir),
            "<|begin_of_text|>",
            "<|eot_id|>",
        ),
        ("embedded default (ChatML)", chatml, plain.clone(), "", "<|im_end|>"),
        // Block tags on their own lines: what jinja2's trim_blocks and lstrip_blocks
        // (transformers sets both) do to whitespace.
        ("blocks on their own lines", fixtures.join("blocks-on-their-own-lines.jinja"), plain, "", ""),
    ];
    for (name, template, tokenizer_file, bos, eos) in templates {
        let out = std::process::Command::new(&python)
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/chat_template_ids.py"))
            .args([&tokenizer_file, &template])
            .args([bos, eos])
            .arg(&cases_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: transformers: {}", String::from_utf8_lossy(&out.stderr));
        let reference: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        let ours = ChatTemplate::from_jinja(&std::fs::read_to_string(&template).unwrap(), bos, eos, name).unwrap();
        let tokenizer = TextTokenizer::from_file(&tokenizer_file).unwrap();
        for (case, want) in cases.as_array().unwrap().iter().zip(&reference) {
            let text = ours.render(case[0].as_str().unwrap(), case[1].as_str().unwrap()).unwrap();
            assert_eq!(text, want["text"].as_str().unwrap(), "{name}: the rendered prompt differs for {case}");
            let ids: Vec<i64> = tokenizer.encode(&text).unwrap();
            let want_ids: Vec<i64> = serde_json::from_value(want["ids"].clone()).unwrap();
            assert_eq!(ids, want_ids, "{name}: the ids differ for {case}");
        }
    }
}

#[test]
fn a_model_folder_with_its_own_chat_template_is_prompted_with_it() {
    use orchestrate_core::model::chat::ChatTemplate;
    use orchestrate_core::model::{chat_prompt, TextTokenizer, DEFAULT_SYSTEM};
    let (p, dir) = built();
    // A copy of the embedded default that ships a Llama-3-style template.
    let own = p.path().join("own-model");
    std::fs::create_dir(&own).unwrap();
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, own.join(f.file_name().unwrap())).unwrap();
    }
    let template = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/llama-3-instruct.jinja"),
    )
    .unwrap();
    std::fs::write(
        own.join("tokenizer_config.json"),
        serde_json::json!({"bos_token": "<|begin_of_text|>", "chat_template": template}).to_string(),
    )
    .unwrap();
    let tokenizer = TextTokenizer::from_file(&own.join("tokenizer.json")).unwrap();
    let prompt = "A warehouse holds 5 boxes.";
    let args = ["--prompt", prompt, "--greedy", "--max-new-tokens", "2"];
    let own_dir = own.to_str().unwrap();
    let v = generate_json(&p, &[&["--model", own_dir][..], &args].concat());
    let rendered = ChatTemplate::from_jinja(&template, "<|begin_of_text|>", "", "t")
        .unwrap()
        .render(DEFAULT_SYSTEM, prompt)
        .unwrap();
    assert!(rendered.starts_with("<|begin_of_text|><|start_header_id|>system"), "{rendered}");
    assert_eq!(v["prompt_ids"], serde_json::json!(tokenizer.encode(&rendered).unwrap()));
    // --chat-template chatml, and the folder without a template, give ChatML.
    let chatml = serde_json::json!(tokenizer.encode(&chat_prompt(DEFAULT_SYSTEM, prompt)).unwrap());
    let forced = generate_json(&p, &[&["--model", own_dir, "--chat-template", "chatml"][..], &args].concat());
    assert_eq!(forced["prompt_ids"], chatml);
    let plain = generate_json(&p, &[&["--model", dir.as_str()][..], &args].concat());
    assert_eq!(plain["prompt_ids"], chatml);
    // A template shipped as chat_template.jinja (transformers' newer layout)
    // survives model.import and is what the imported folder is prompted with.
    let jinja = p.path().join("jinja-model");
    std::fs::create_dir(&jinja).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(std::path::Path::new(&dir).join(f), jinja.join(f)).unwrap();
    }
    std::fs::write(jinja.join("chat_template.jinja"), &template).unwrap();
    p.write("imp.yaml", "name: imp\nnodes:\n  own:\n    op: model.import\n    params: {path: jinja-model}\n");
    p.run_json(&["imp.yaml"], 0);
    let out = p.run(&["path", "imp.yaml", "own:model"]);
    let imported = stdout(&out).trim().to_string();
    assert!(
        std::path::Path::new(&imported).join("chat_template.jinja").is_file(),
        "model.import dropped chat_template.jinja"
    );
    let v = generate_json(&p, &[&["--model", imported.as_str()][..], &args].concat());
    let without_bos = ChatTemplate::from_jinja(&template, "", "", "t").unwrap().render(DEFAULT_SYSTEM, prompt).unwrap();
    assert_eq!(v["prompt_ids"], serde_json::json!(tokenizer.encode(&without_bos).unwrap()));
}

/// A Qwen3 and a Llama folder written by transformers (random weights, the
/// embedded default's tokenizer; Llama's with its header tokens, its chat
/// template and `<|eot_id|>` as the turn end) are imported by `model.import`,
/// which reads the family from `model_type`, then fine-tuned, sampled and
/// scored as Qwen2 is; the trained folder keeps its family.
#[test]
fn qwen3_and_llama_folders_are_imported_trained_and_scored_like_qwen2() {
    let (p, model_dir) = built();
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let llama_tokens = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
    for family in ["qwen3", "llama"] {
        let folder = p.path().join(family);
        std::fs::create_dir(&folder).unwrap();
        let tokenizer = match family {
            "llama" => {
                let t = tokenizer_with(&model_dir, &llama_tokens, &folder);
                let template =
                    std::fs::read_to_string(root.join("tests/fixtures/chat_templates/llama-3-instruct.jinja"));
                let config = serde_json::json!({"chat_template": template.unwrap(), "bos_token": "<|begin_of_text|>",
                    "eos_token": "<|eot_id|>"});
                std::fs::write(folder.join("tokenizer_config.json"), config.to_string()).unwrap();
                t
            }
            _ => {
                let t = folder.join("tokenizer.json");
                std::fs::copy(std::path::Path::new(&model_dir).join("tokenizer.json"), &t).unwrap();
                t
            }
        };
        let tok = orchestrate_core::model::TextTokenizer::from_file(&tokenizer).unwrap();
        let vocab = (tok.vocab_size() as usize).div_ceil(64) * 64;
        let out = std::process::Command::new(&python)
            .arg(root.join("tests/python/hf_reference.py"))
            .arg(&folder)
            .args([family, &vocab.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{family}: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::remove_dir_all(folder.join("sharded")).unwrap();
        std::fs::remove_file(folder.join("reference.json")).unwrap();
        // transformers' generation_config names eos 2 (Llama's default): the stop set holds both.
        let loaded = orchestrate_core::model::TextTokenizer::from_model_folder(&folder).unwrap();
        let turn_end = if family == "llama" { "<|eot_id|>" } else { "<|im_end|>" };
        assert_eq!(loaded.eos_id().unwrap(), loaded.token_id(turn_end).unwrap(), "{family}");
        assert!(loaded.stop_ids().contains(&loaded.eos_id().unwrap()), "{family}");
        let spec = format!(
            r#"
name: {family}
nodes:
  data:
    op: dataset.stock_arithmetic
    params: {{seed: 0, train: 200, validation: 20, test_id50: 4, test_ood100: 4, warmstart: 16}}
  base:
    op: model.import
    params: {{path: {family}}}
  sft:
    op: train.sft
    inputs: {{model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train', validation_pages: 'data:pages.validation', validation_labels: 'data:labels.validation'}}
    params: {{branch: warmstart, epochs: 1, batch_size: 8, lr: 1.0e-3}}
  grpo:
    op: train.grpo
    inputs: {{model: 'sft:model', pages: 'data:pages.train', labels: 'data:labels.train'}}
    params: {{iterations: 1, group_size: 2, prompts_per_iteration: 2, max_new_tokens: 8, lr: 1.0e-5}}
  gen:
    op: eval.generate
    inputs: {{model: 'grpo:model', pages: 'data:pages.test'}}
    params: {{draws: 1, max_new_tokens: 8}}
  score:
    op: eval.score
    inputs: {{responses: 'gen:responses', summary: 'gen:summary', labels: 'data:labels.test'}}
"#
        );
        p.write(&format!("{family}.yaml"), &spec);
        let ev = p.run_json(&[&format!("{family}.yaml")], 0);
        let ran: Vec<String> = nodes_with(&ev, "node_finished").into_iter().filter(|n| n != "data").collect();
        assert_eq!(ran, ["base", "gen", "grpo", "score", "sft"], "{family}");
        let out = p.run(&["path", &format!("{family}.yaml"), "grpo:model"]);
        let trained = stdout(&out).trim().to_string();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(&trained).join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["model_type"], family, "the trained folder keeps its family");
        let results = stdout(&p.run(&["path", &format!("{family}.yaml"), "score:results"])).trim().to_string();
        let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(results).unwrap()).unwrap();
        assert_eq!(results["greedy"]["ALL"]["responses"], 8, "{family}: {results}");
    }
}
