//! Model ops: `tokenizer.build` (BPE on the train split), `model.init` (a tiny
//! Qwen2 from a seed, run in the worker) and `model.import` (a local Hugging
//! Face folder, hashed and checked). All write the Hugging Face layout, so one
//! loader serves every model.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::worker::WorkerOp;
use super::{read_jsonl, InputDecl, Op, OpError, OutputDecl, OutputKind, ParamError, Role, RunContext};
use crate::model::{build_bpe, chat_prompt, HfFolder, DEFAULT_SYSTEM, IM_END};

fn failed(e: impl std::fmt::Display) -> OpError {
    OpError::Failed(e.to_string())
}

/// Params of `tokenizer.build`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizerParams {
    /// Target vocabulary size, special tokens included (training may stop below it).
    #[serde(default = "d_vocab")]
    #[schemars(range(min = 300))]
    pub vocab_size: usize,
    /// The system message of the chat prompts the tokenizer is trained on.
    #[serde(default = "d_system")]
    pub system: String,
}

fn d_vocab() -> usize {
    1024
}
fn d_system() -> String {
    DEFAULT_SYSTEM.to_string()
}

/// `tokenizer.build`: a byte-level BPE with ChatML special tokens (`<|im_end|>`
/// is EOS), pre-tokenized as Qwen2's (one token per digit), trained on the
/// train split's chat prompts and reference responses.
pub struct TokenizerBuild;

impl Op for TokenizerBuild {
    fn name(&self) -> &'static str {
        "tokenizer.build"
    }
    /// 2: Qwen2's pre-tokenization (NFC, its regex: one token per digit).
    fn version(&self) -> u32 {
        2
    }
    fn summary(&self) -> &'static str {
        "byte-level BPE with ChatML tokens, trained on train statements and reference responses"
    }
    type Params = TokenizerParams;
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![
            InputDecl::required("pages", "the train split's pages (data:pages.train)"),
            InputDecl::required("labels", "the train split's labels (data:labels.train), for reference responses"),
        ])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        // The tokenizer is a model artifact, not labels: it carries no taint.
        vec![OutputDecl { taint: Some(BTreeSet::new()), ..OutputDecl::file("tokenizer") }]
    }
    fn role(&self, _params: &Self::Params) -> Role {
        Role::Training
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let pages: Vec<Value> = read_jsonl(ctx.input_path("pages")?)?;
        let labels: Vec<Value> = read_jsonl(ctx.input_path("labels")?)?;
        let mut texts = Vec::with_capacity(pages.len() + labels.len());
        for page in &pages {
            let statement = page["statement"].as_str().ok_or_else(|| failed("a page has no statement"))?;
            texts.push(chat_prompt(&p.system, statement));
        }
        for label in &labels {
            let response =
                label["reference_response"].as_str().ok_or_else(|| failed("a label has no reference_response"))?;
            texts.push(format!("{response}{IM_END}"));
        }
        build_bpe(&texts, p.vocab_size, &ctx.output_path("tokenizer")).map_err(failed)
    }
}

/// Params of `model.init`: the embedded default's size (about 0.9M parameters).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelInitParams {
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "d_hidden")]
    #[schemars(range(min = 8))]
    pub hidden_size: usize,
    #[serde(default = "d_intermediate")]
    #[schemars(range(min = 8))]
    pub intermediate_size: usize,
    #[serde(default = "d_layers")]
    #[schemars(range(min = 1))]
    pub num_hidden_layers: usize,
    #[serde(default = "d_heads")]
    #[schemars(range(min = 1))]
    pub num_attention_heads: usize,
    #[serde(default = "d_kv_heads")]
    #[schemars(range(min = 1))]
    pub num_key_value_heads: usize,
    #[serde(default = "d_positions")]
    #[schemars(range(min = 320))]
    pub max_position_embeddings: usize,
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    /// The embedding is padded to a multiple of this (as Qwen's is), so some ids
    /// have no token: generating one makes a response invalid, as it should.
    #[serde(default = "d_multiple")]
    #[schemars(range(min = 1))]
    pub vocab_multiple: usize,
}

fn d_hidden() -> usize {
    128
}
fn d_intermediate() -> usize {
    384
}
fn d_layers() -> usize {
    4
}
fn d_heads() -> usize {
    4
}
fn d_kv_heads() -> usize {
    2
}
fn d_positions() -> usize {
    512
}
fn d_theta() -> f64 {
    10000.0
}
fn d_multiple() -> usize {
    64
}

/// `model.init`: a Qwen2-architecture model with random weights from a seed.
pub struct ModelInit;

impl Op for ModelInit {
    fn name(&self) -> &'static str {
        WorkerOp::ModelInit.name()
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "a tiny Qwen2 from a seed, in Hugging Face layout (runs in the worker)"
    }
    type Params = ModelInitParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        let bad = |field: &str, message: String| ParamError { path: vec![field.into()], message, unknown_key: false };
        if p.num_attention_heads % p.num_key_value_heads != 0 {
            return Err(bad("num_key_value_heads", "must divide num_attention_heads".into()));
        }
        if p.hidden_size % p.num_attention_heads != 0 || (p.hidden_size / p.num_attention_heads) % 2 != 0 {
            return Err(bad("hidden_size", "must be num_attention_heads × an even head size".into()));
        }
        Ok(())
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(vec![InputDecl::required("tokenizer", "a tokenizer.json (tokenizer.build's output)")])
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl { kind: OutputKind::Dir, ..OutputDecl::file("model") }]
    }
    fn numerical(&self) -> bool {
        true
    }
    fn run(&self, _params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(WorkerOp::ModelInit, ctx)
    }
}

/// Params of `model.import`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelImportParams {
    /// A local Hugging Face folder (relative to the spec's folder, or absolute).
    pub path: String,
    /// The expected commit of the weights, checked against the download
    /// metadata `huggingface-cli download --local-dir` leaves in `.cache/huggingface/`.
    #[serde(default)]
    pub revision: Option<String>,
    /// The expected number of unique parameters (494032768 for Qwen2.5-0.5B-Instruct).
    #[serde(default)]
    pub parameters: Option<u64>,
}

/// `model.import`: hashes a local model folder into the key and checks it.
pub struct ModelImport;

const IMPORTED: [&str; 6] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
];

fn import_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = IMPORTED.iter().map(|f| dir.join(f)).filter(|p| p.is_file()).collect();
    if let Ok(folder) = (HfFolder { dir: dir.to_path_buf() }).weight_files() {
        files.extend(folder);
    }
    files.sort();
    files.dedup();
    files
}

impl Op for ModelImport {
    fn name(&self) -> &'static str {
        "model.import"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "a local Hugging Face model folder, hashed and checked (revision, parameter count)"
    }
    type Params = ModelImportParams;
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(Vec::new())
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl { kind: OutputKind::Dir, ..OutputDecl::file("model") }]
    }
    fn file_deps(&self, p: &Self::Params, spec_dir: &Path) -> Vec<String> {
        // The folder's content is in the key: every file that loading reads.
        let dir = spec_dir.join(&p.path);
        import_files(&dir)
            .iter()
            .filter_map(|f| f.strip_prefix(&dir).ok().map(|rel| Path::new(&p.path).join(rel).display().to_string()))
            .collect()
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let dir = ctx.spec_dir.join(&p.path);
        let folder = HfFolder::open(&dir).map_err(failed)?;
        let config = folder.config().map_err(failed)?;
        let stored = folder.stored_parameter_count().map_err(failed)?;
        if stored != config.parameter_count() {
            return Err(failed(format!(
                "{}: the weight files hold {stored} parameters but config.json implies {}",
                dir.display(),
                config.parameter_count()
            )));
        }
        if let Some(expected) = p.parameters {
            if stored != expected {
                return Err(failed(format!("{}: {stored} parameters, expected {expected}", dir.display())));
            }
        }
        if let Some(revision) = &p.revision {
            check_revision(&dir, revision)?;
        }
        let out = ctx.output_path("model");
        std::fs::create_dir_all(&out).map_err(|e| OpError::io(format!("creating {}", out.display()), e))?;
        for f in import_files(&dir) {
            let name = f.file_name().expect("files have names");
            std::fs::copy(&f, out.join(name)).map_err(|e| OpError::io(format!("copying {}", f.display()), e))?;
        }
        Ok(())
    }
}

/// Checks the commit recorded by `huggingface-cli download --local-dir`.
fn check_revision(dir: &Path, revision: &str) -> Result<(), OpError> {
    let meta = dir.join(".cache/huggingface/download/config.json.metadata");
    let text = std::fs::read_to_string(&meta).map_err(|_| {
        failed(format!(
            "{}: cannot verify revision {revision}: no {} (download with `huggingface-cli download --local-dir`, or drop `revision`)",
            dir.display(),
            meta.display()
        ))
    })?;
    let recorded = text.lines().next().unwrap_or_default().trim();
    if recorded != revision {
        return Err(failed(format!("{}: revision {recorded}, expected {revision}", dir.display())));
    }
    Ok(())
}
