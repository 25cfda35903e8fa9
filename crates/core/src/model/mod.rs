//! Model files without libtorch: the Hugging Face folder layout, the Qwen2
//! config, ChatML prompts, the tokenizer, and the BPE tokenizer the embedded
//! default builds. The network itself is in `crates/torch/src/` (the worker binary).

pub mod chat;
pub mod config;
pub mod tokenizer;

use std::path::{Path, PathBuf};

pub use config::ModelConfig;
pub use tokenizer::{build_bpe, TextTokenizer, TokenizerError};

/// ChatML special tokens (as in Qwen2.5).
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// The system message Qwen2.5's chat template inserts when none is given.
pub const DEFAULT_SYSTEM: &str = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/// The protocol's token budgets (shared/seeds/003): prompt ≤ 256, response ≤ 64, total ≤ 320.
pub const MAX_PROMPT_TOKENS: usize = 256;
pub const MAX_RESPONSE_TOKENS: usize = 64;

/// A system + user conversation rendered in ChatML with the generation prompt,
/// written out explicitly rather than through a Jinja template.
pub fn chat_prompt(system: &str, user: &str) -> String {
    format!("{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n")
}

/// The most a model folder's JSON file (`config.json`, the shard index, the
/// tokenizer and generation configs) may hold.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// The most `tokenizer.json` may hold (the largest in use are tens of MB).
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// The largest safetensors header read (a model's weights, a training
/// state): safetensors' own limit.
pub const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// A safetensors file's header alone (each tensor's dtype, shape and
/// offsets), read without its tensors' bytes. The file must be exactly its
/// header and the tensors the header lists, as safetensors' own reader
/// requires of a whole file.
pub fn safetensors_header(path: &Path) -> Result<safetensors::tensor::Metadata, FolderError> {
    use std::io::Read;
    let invalid = |what: String| FolderError::Invalid(format!("{}: {what}", path.display()));
    let mut file = crate::fsread::open_regular(path, 0).map_err(|e| invalid(e.to_string()))?;
    let len = file.metadata().map_err(|e| invalid(e.to_string()))?.len();
    let mut n = [0u8; 8];
    file.read_exact(&mut n).map_err(|e| invalid(format!("not a safetensors file: {e}")))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_SAFETENSORS_HEADER || 8 + n > len {
        return Err(invalid(format!(
            "a header of {n} bytes, in a file of {len} (safetensors allows {MAX_SAFETENSORS_HEADER})"
        )));
    }
    let mut head = vec![0u8; n as usize];
    file.read_exact(&mut head).map_err(|e| invalid(format!("the header is cut short: {e}")))?;
    let head = std::str::from_utf8(&head).map_err(|e| invalid(format!("the header is not UTF-8: {e}")))?;
    // Deserializing checks the tensors: contiguous from 0, each as long as
    // its dtype and shape make it.
    let meta: safetensors::tensor::Metadata =
        serde_json::from_str(head).map_err(|e| invalid(format!("not a safetensors header: {e}")))?;
    let data = meta.tensors().values().map(|t| t.data_offsets.1 as u64).max().unwrap_or(0);
    if 8 + n + data != len {
        return Err(invalid(format!("{len} bytes, where its header says {}", 8 + n + data)));
    }
    Ok(meta)
}

/// Files of a Hugging Face model folder.
#[derive(Debug, Clone)]
pub struct HfFolder {
    pub dir: PathBuf,
}

/// A folder that is not a loadable model, with what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FolderError {
    #[error(
        "{0}: no such folder. Real runs load Qwen2.5-0.5B-Instruct from a local Hugging Face folder \
         (config.json, model.safetensors, tokenizer.json); nothing is downloaded at run time. Get it on a \
         machine with network access, e.g. `huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --revision \
         7ae557604adf67be50417f59c2c2f167def9a775 --local-dir DIR`, and copy DIR here"
    )]
    Missing(PathBuf),
    #[error("{dir}: missing {file} (a Hugging Face model folder needs config.json, tokenizer.json and model.safetensors or model.safetensors.index.json)")]
    MissingFile { dir: PathBuf, file: &'static str },
    #[error("{0}")]
    Invalid(String),
}

impl HfFolder {
    /// Checks that a folder has what loading needs.
    pub fn open(dir: &Path) -> Result<HfFolder, FolderError> {
        if !dir.is_dir() {
            return Err(FolderError::Missing(dir.to_path_buf()));
        }
        for file in ["config.json", "tokenizer.json"] {
            if !dir.join(file).is_file() {
                return Err(FolderError::MissingFile { dir: dir.to_path_buf(), file });
            }
        }
        let f = HfFolder { dir: dir.to_path_buf() };
        if f.weight_files()?.is_empty() {
            return Err(FolderError::MissingFile { dir: dir.to_path_buf(), file: "model.safetensors" });
        }
        Ok(f)
    }

    pub fn config(&self) -> Result<ModelConfig, FolderError> {
        let path = self.dir.join("config.json");
        let text = crate::fsread::read_regular_text(&path, MAX_JSON_BYTES)
            .map_err(|e| FolderError::Invalid(format!("{}: {e}", path.display())))?;
        ModelConfig::from_json(&text).map_err(|e| FolderError::Invalid(format!("{}: {e}", path.display())))
    }

    /// The weight files: `model.safetensors`, or the shards listed by the index.
    pub fn weight_files(&self) -> Result<Vec<PathBuf>, FolderError> {
        let single = self.dir.join("model.safetensors");
        if single.is_file() {
            return Ok(vec![single]);
        }
        let index = self.dir.join("model.safetensors.index.json");
        if !index.is_file() {
            return Ok(Vec::new());
        }
        let paths: Vec<PathBuf> = shard_names(&index)?.iter().map(|f| self.dir.join(f)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
            return Err(FolderError::Invalid(format!("{}: shard {} is missing", index.display(), missing.display())));
        }
        Ok(paths)
    }

    /// Unique parameters stored in the weight files, from their safetensors
    /// headers alone (a 4B model's shards are gigabytes each).
    pub fn stored_parameter_count(&self) -> Result<u64, FolderError> {
        let mut total = 0u64;
        for path in self.weight_files()? {
            let meta = safetensors_header(&path)?;
            for info in meta.tensors().values() {
                total += info.shape.iter().map(|d| *d as u64).product::<u64>();
            }
        }
        Ok(total)
    }

    pub fn tokenizer(&self) -> Result<TextTokenizer, TokenizerError> {
        TextTokenizer::from_model_folder(&self.dir)
    }
}

/// The shard files a `model.safetensors.index.json` names, sorted and unique:
/// plain file names only, so an index (which may come from the network) cannot
/// point outside its folder.
pub fn shard_names(index: &Path) -> Result<Vec<String>, FolderError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: std::collections::BTreeMap<String, String>,
    }
    let text = crate::fsread::read_regular_text(index, MAX_JSON_BYTES)
        .map_err(|e| FolderError::Invalid(format!("{}: {e}", index.display())))?;
    let parsed: Index = serde_json::from_str(&text)
        .map_err(|e| FolderError::Invalid(format!("{}: not a safetensors index: {e}", index.display())))?;
    let names: std::collections::BTreeSet<String> = parsed.weight_map.into_values().collect();
    if let Some(n) = names.iter().find(|n| n.is_empty() || n.contains(['/', '\\']) || *n == "." || *n == "..") {
        return Err(FolderError::Invalid(format!("{}: shard '{n}' is not a plain file name", index.display())));
    }
    Ok(names.into_iter().collect())
}

/// The `generation_config.json` that `model.init` writes beside a new model:
/// the sampling the protocol uses (temperature 1, no top-k or top-p) and the
/// end-of-sequence id, in Hugging Face's field names. Fields in name order:
/// the bytes are those the untyped object had, so the model's hash is too.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationConfig {
    pub do_sample: bool,
    pub eos_token_id: i64,
    pub temperature: f64,
    pub top_k: u32,
    pub top_p: f64,
}

impl GenerationConfig {
    /// What a new model samples with: the protocol's temperature-1 draws.
    pub fn sampling(eos_token_id: i64) -> Self {
        GenerationConfig { do_sample: true, eos_token_id, temperature: 1.0, top_k: 0, top_p: 1.0 }
    }
}

/// One hand-made generation (`orchestrate generate`), as the CLI hands it to
/// the worker: the CLI parses the command line, the worker runs the model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// A Hugging Face model folder.
    pub model: PathBuf,
    /// A user message (the chat template is applied), or `prompt_ids`.
    pub prompt: Option<String>,
    /// Raw prompt ids, fed untouched.
    pub prompt_ids: Option<Vec<i64>>,
    /// The system message for `prompt`.
    pub system: String,
    /// The chat template `prompt` is rendered with.
    #[serde(default)]
    pub chat_template: chat::TemplateChoice,
    /// Greedy decoding, even if `seed` is given.
    pub greedy: bool,
    /// Sample at temperature 1, reproducibly from (seed, rollout id, position).
    pub seed: Option<u64>,
    pub rollout_id: u64,
    pub max_new_tokens: usize,
    /// Prompts longer than this are refused (nothing is truncated).
    pub max_prompt_tokens: usize,
    /// Recompute the whole prefix at every step instead of using the KV cache.
    pub no_cache: bool,
    /// Print ids, behavior log-probs and the finish reason as JSON.
    pub json: bool,
}

/// What `orchestrate generate --json` prints: the worker's answer to a
/// [`GenerateRequest`], one generation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateResponse {
    /// The prompt as fed to the model (the chat template applied).
    pub prompt_ids: Vec<i64>,
    /// The response ids, the final EOS included when there is one.
    pub ids: Vec<i64>,
    /// The response decoded, without its final EOS.
    pub text: String,
    /// log p(token) under the logits it was sampled from, one per id.
    pub behavior_logprobs: Vec<f32>,
    pub finish_reason: crate::data::verifier::FinishReason,
    /// Ids the tokenizer could not decode (the response would be invalid).
    pub undecodable_ids: Vec<u32>,
    pub sampling: GenerateSampling,
    /// The device it ran on (`Cpu`, `Cuda(0)`).
    pub device: String,
    pub seconds: f64,
}

/// How a generation sampled: `"greedy"`, or from (seed, rollout id).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum GenerateSampling {
    Greedy(Greedy),
    Sample { seed: u64, rollout_id: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Greedy {
    Greedy,
}

#[cfg(test)]
mod generation_config_tests {
    use super::GenerationConfig;

    /// The typed file has the bytes the untyped object had (so a new model's
    /// hash, and every key after it, is unchanged), and reads back as itself.
    #[test]
    fn a_generation_config_writes_the_bytes_the_untyped_one_did() {
        let untyped =
            serde_json::json!({"eos_token_id": 7, "do_sample": true, "temperature": 1.0, "top_k": 0, "top_p": 1.0});
        let typed = GenerationConfig::sampling(7);
        assert_eq!(serde_json::to_string_pretty(&typed).unwrap(), serde_json::to_string_pretty(&untyped).unwrap());
        let back: GenerationConfig = serde_json::from_value(untyped).unwrap();
        assert_eq!(back, typed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompts_are_chatml_with_the_generation_prompt() {
        assert_eq!(
            chat_prompt("sys", "hi"),
            "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_missing_folder_says_how_to_get_the_weights() {
        let err = HfFolder::open(Path::new("/nonexistent/qwen")).unwrap_err().to_string();
        assert!(err.contains("huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct"), "{err}");
    }

    /// A weights file of `data` bytes (one `U8` tensor), sparse past its
    /// header: its bytes take no disk.
    fn sparse_weights(path: &Path, data: u64) {
        let header = format!(r#"{{"w":{{"dtype":"U8","shape":[{data}],"data_offsets":[0,{data}]}}}}"#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        std::fs::write(path, &bytes).unwrap();
        std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(bytes.len() as u64 + data).unwrap();
    }

    /// Counting the parameters reads the safetensors headers, not the
    /// weights: a 1 TiB weights file (sparse) is counted at once, where
    /// reading it whole into memory could not be done at all (a 4B model's
    /// shards were read whole, gigabytes each, to count them).
    #[test]
    fn the_parameter_count_reads_the_weights_headers_not_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let data = 1u64 << 40;
        sparse_weights(&dir.path().join("model.safetensors"), data);
        let folder = HfFolder { dir: dir.path().to_path_buf() };
        assert_eq!(folder.stored_parameter_count().unwrap(), data);

        // A file longer or shorter than its header says is refused, as
        // safetensors' own reader refuses it.
        let path = dir.path().join("model.safetensors");
        let full = std::fs::metadata(&path).unwrap().len();
        for len in [full + 1, full - 1] {
            std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len).unwrap();
            let err = folder.stored_parameter_count().unwrap_err().to_string();
            assert!(err.contains("model.safetensors") && err.contains("header says"), "{err}");
        }
        // A header past what safetensors allows is refused before it is read.
        std::fs::write(&path, u64::MAX.to_le_bytes()).unwrap();
        let err = folder.stored_parameter_count().unwrap_err().to_string();
        assert!(err.contains("header of"), "{err}");
    }

    /// A FIFO where a model folder's file should be is refused at once, not
    /// waited on, and a file over its bound is refused before it is read; a
    /// link to a real file (a Hugging Face cache folder's files are links into
    /// its blobs) still reads.
    #[test]
    fn a_model_folders_files_are_regular_files_of_bounded_size() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["config.json", "tokenizer.json"] {
            crate::fsread::mkfifo(&dir.path().join(name));
        }
        std::fs::write(dir.path().join("model.safetensors.index.json"), "").unwrap();
        std::fs::File::create(dir.path().join("model.safetensors.index.json"))
            .unwrap()
            .set_len(MAX_JSON_BYTES + 1)
            .unwrap();
        let folder = HfFolder { dir: dir.path().to_path_buf() };
        let (tx, rx) = std::sync::mpsc::channel();
        let read = folder.clone();
        std::thread::spawn(move || tx.send(read.config().map(|_| ()).map_err(|e| e.to_string())).unwrap());
        let err = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("config.json was waited on").unwrap_err();
        assert!(err.contains("config.json") && err.contains("not a regular file"), "{err}");
        let (tx, rx) = std::sync::mpsc::channel();
        let read = folder.clone();
        std::thread::spawn(move || tx.send(read.tokenizer().map(|_| ()).map_err(|e| e.0)).unwrap());
        let err =
            rx.recv_timeout(std::time::Duration::from_secs(10)).expect("tokenizer.json was waited on").unwrap_err();
        assert!(err.contains("tokenizer.json") && err.contains("not a regular file"), "{err}");
        let err = shard_names(&dir.path().join("model.safetensors.index.json")).unwrap_err().to_string();
        assert!(err.contains("model.safetensors.index.json") && err.contains("over the"), "{err}");

        let blobs = tempfile::tempdir().unwrap();
        std::fs::write(blobs.path().join("index"), r#"{"weight_map":{"a":"model-1.safetensors"}}"#).unwrap();
        let linked = dir.path().join("linked.index.json");
        std::os::unix::fs::symlink(blobs.path().join("index"), &linked).unwrap();
        assert_eq!(shard_names(&linked).unwrap(), vec!["model-1.safetensors".to_string()]);
    }
}
