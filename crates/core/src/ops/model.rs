//! Model ops: `tokenizer.build` (BPE on the train split), `model.init` (a tiny
//! Qwen2 from a seed, run in the worker) and `model.import` (a local Hugging
//! Face folder, hashed and checked). All write the Hugging Face layout, so one
//! loader serves every model.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::worker::{WorkerOp, WorkerTask};
use super::{InputDecl, Op, OpError, OutputDecl, OutputKind, ParamError, Role, RunContext};
use crate::data::rows::{read_labels, read_pages, reference_response};
use crate::model::config::ConfigError;
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
        let pages = read_pages(ctx.input_path("pages")?, "pages").map_err(failed)?;
        let labels = read_labels(ctx.input_path("labels")?, "labels").map_err(failed)?;
        let mut texts = Vec::with_capacity(pages.len() + labels.len());
        for page in &pages {
            texts.push(chat_prompt(&p.system, &page.statement));
        }
        for label in &labels {
            let response = reference_response(label, "labels of tokenizer.build").map_err(failed)?;
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
    /// The exact embedding size, for a real model's shape (151936 for
    /// Qwen2.5-0.5B): at least the tokenizer's vocabulary. Unset: the
    /// tokenizer's, padded to `vocab_multiple`. (Absent from the key when unset,
    /// so specs without it keep their keys.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub vocab_size: Option<usize>,
}

impl ModelInitParams {
    /// The config `model.init` writes, for a tokenizer of `tokenizer_vocab` tokens.
    pub fn config(&self, tokenizer_vocab: usize, eos: i64) -> Result<crate::model::ModelConfig, ConfigError> {
        let vocab = match self.vocab_size {
            Some(v) if v < tokenizer_vocab => {
                return Err(ConfigError(format!(
                    "params.vocab_size {v} is below the tokenizer's vocabulary of {tokenizer_vocab}"
                )))
            }
            Some(v) => v,
            None => tokenizer_vocab.div_ceil(self.vocab_multiple) * self.vocab_multiple,
        };
        serde_json::from_value(serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": vocab,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": true,
            "hidden_act": "silu",
            "eos_token_id": eos,
            "bos_token_id": serde_json::Value::Null,
            "attention_dropout": 0.0,
            "use_sliding_window": false,
        }))
        .map_err(|e| ConfigError(format!("model.init config: {e}")))
    }
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
    fn run(&self, params: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        super::worker::run_in_worker(WorkerTask::ModelInit(params.clone()), ctx)
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

const IMPORTED: [&str; 7] = [
    "config.json",
    "tokenizer.json",
    crate::model::chat::TEMPLATE_FILES[0],
    crate::model::chat::TEMPLATE_FILES[1],
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
];

/// The name a file of the imported folder has among the node's file deps
/// (the folder as the spec names it, then the file): what its key holds.
fn keyed_name(path: &str, dir: &Path, file: &Path) -> Option<String> {
    file.strip_prefix(dir).ok().map(|rel| Path::new(path).join(rel).display().to_string())
}

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
        import_files(&dir).iter().filter_map(|f| keyed_name(&p.path, &dir, f)).collect()
    }
    fn linked_dep_help(&self) -> Option<&'static str> {
        Some(
            "a Hugging Face cache snapshot is links into the cache: use model.hub with its repo and revision, which \
             reads that cache (offline too, with HF_HUB_OFFLINE=1), or download real files with \
             `huggingface-cli download REPO --local-dir DIR`",
        )
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let dir = ctx.spec_dir.join(&p.path);
        if let Some(revision) = &p.revision {
            check_revision(&dir, revision)?;
        }
        let files = import_files(&dir);
        let out = ctx.output_path("model");
        check_and_copy(&dir, &files, p.parameters, &out)?;
        // What is stored is what the key holds: each copy is checked against
        // its file's blake3 in the key (an edit during the run fails here).
        for f in &files {
            let (Some(keyed), Some(name)) = (keyed_name(&p.path, &dir, f), f.file_name()) else {
                return Err(failed(format!("{}: not a file of {}", f.display(), dir.display())));
            };
            let copy = out.join(name);
            let opened =
                std::fs::File::open(&copy).map_err(|e| OpError::io(format!("reading {}", copy.display()), e))?;
            ctx.check_keyed_open_file(&keyed, &opened)?;
        }
        Ok(())
    }
}

/// Checks a model folder (loadable, its parameter count as its config implies
/// and as expected), then copies `files` into `out`.
fn check_and_copy(dir: &Path, files: &[PathBuf], parameters: Option<u64>, out: &Path) -> Result<(), OpError> {
    let folder = HfFolder::open(dir).map_err(failed)?;
    let config = folder.config().map_err(failed)?;
    let stored = folder.stored_parameter_count().map_err(failed)?;
    if stored != config.parameter_count() {
        return Err(failed(format!(
            "{}: the weight files hold {stored} parameters but config.json implies {}",
            dir.display(),
            config.parameter_count()
        )));
    }
    if let Some(expected) = parameters {
        if stored != expected {
            return Err(failed(format!("{}: {stored} parameters, expected {expected}", dir.display())));
        }
    }
    // A real folder: one planted as a link in staging is refused, never written into.
    crate::store::fsx::own_dir(out).map_err(|e| OpError::Failed(format!("creating {}: {e}", out.display())))?;
    for f in files {
        let name = f.file_name().expect("files have names");
        // `copy` reads through the Hugging Face cache's symlinks: the store holds bytes.
        crate::store::fsx::copy_file(f, &out.join(name))
            .map_err(|e| OpError::io(format!("copying {}", f.display()), e))?;
    }
    Ok(())
}

/// Params of `model.hub`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelHubParams {
    /// The Hub model repo, `owner/name`.
    pub repo: String,
    /// The full 40-character commit id (a branch or tag is refused: it moves).
    pub revision: String,
    /// The expected number of unique parameters (494032768 for Qwen2.5-0.5B-Instruct).
    #[serde(default)]
    pub parameters: Option<u64>,
}

/// `model.hub`: a model from the Hugging Face Hub pinned by commit, through
/// Python's cache (`HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN`,
/// `HF_HUB_OFFLINE`), every file checked against the hash the Hub announced.
/// The key is the repo and the commit: a commit names its files' content.
pub struct ModelHub;

/// The files a model folder is loaded from, besides the weights.
const HUB_REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const HUB_OPTIONAL: [&str; 3] =
    [crate::model::chat::TEMPLATE_FILES[0], crate::model::chat::TEMPLATE_FILES[1], "generation_config.json"];

impl Op for ModelHub {
    fn name(&self) -> &'static str {
        "model.hub"
    }
    /// 2: the folder keeps the repo's `chat_template.jinja`, if it has one.
    fn version(&self) -> u32 {
        2
    }
    fn summary(&self) -> &'static str {
        "a Hugging Face Hub model pinned by commit, through the Hugging Face cache, every file hash-checked"
    }
    type Params = ModelHubParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        let err = |field: &str, message: String| ParamError { path: vec![field.into()], message, unknown_key: false };
        crate::hub::check_repo(&p.repo).map_err(|m| err("repo", m.to_string()))?;
        crate::hub::check_commit(&p.repo, &p.revision).map_err(|m| err("revision", m.to_string()))
    }
    fn inputs(&self, _params: &Self::Params) -> Option<Vec<InputDecl>> {
        Some(Vec::new())
    }
    fn outputs(&self, _params: &Self::Params) -> Vec<OutputDecl> {
        vec![OutputDecl { kind: OutputKind::Dir, ..OutputDecl::file("model") }]
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        use std::io::{IsTerminal, Write};
        let config = crate::hub::HubConfig::from_env().map_err(failed)?;
        let mut snap = crate::hub::Snapshot::new(&config, &p.repo, &p.revision).map_err(failed)?;
        snap.progress = std::io::stderr().is_terminal();
        let missing = |f: &str| failed(format!("{f} is not in {} at {} ({})", p.repo, p.revision, config.endpoint));
        let mut fetched = Vec::new();
        for f in HUB_REQUIRED {
            fetched.push(snap.fetch(f).map_err(failed)?.ok_or_else(|| missing(f))?);
        }
        for f in HUB_OPTIONAL {
            fetched.extend(snap.fetch(f).map_err(failed)?);
        }
        match snap.fetch("model.safetensors").map_err(failed)? {
            Some(w) => fetched.push(w),
            None => {
                let index = snap.fetch("model.safetensors.index.json").map_err(failed)?.ok_or_else(|| {
                    failed(format!(
                        "{} at {} has neither model.safetensors nor model.safetensors.index.json",
                        p.repo, p.revision
                    ))
                })?;
                for shard in crate::model::shard_names(&index.path).map_err(failed)? {
                    fetched.push(snap.fetch(&shard).map_err(failed)?.ok_or_else(|| missing(&shard))?);
                }
                fetched.push(index);
            }
        }
        let mut log = ctx.open_log()?;
        for f in &fetched {
            let _ = writeln!(log, "{f}");
        }
        let files: Vec<PathBuf> = fetched.iter().map(|f| f.path.clone()).collect();
        check_and_copy(&snap.dir(), &files, p.parameters, &ctx.output_path("model"))
    }
}

/// Checks the commit recorded by `huggingface-cli download --local-dir`.
fn check_revision(dir: &Path, revision: &str) -> Result<(), OpError> {
    let meta = dir.join(".cache/huggingface/download/config.json.metadata");
    let text = crate::fsread::read_regular_text(&meta, crate::model::MAX_JSON_BYTES).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            failed(format!(
                "{}: cannot verify revision {revision}: no {} (download with `huggingface-cli download --local-dir`, or drop `revision`)",
                dir.display(),
                meta.display()
            ))
        } else {
            failed(format!("{}: cannot verify revision {revision}: {}: {e}", dir.display(), meta.display()))
        }
    })?;
    let recorded = text.lines().next().unwrap_or_default().trim();
    if recorded != revision {
        return Err(failed(format!("{}: revision {recorded}, expected {revision}", dir.display())));
    }
    Ok(())
}
