//! The Qwen2 config, read straight from a Hugging Face `config.json`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of `config.json` the model needs; everything else is kept as is
/// in `extra` and written back unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen2Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    /// transformers < 5 writes `rope_theta`; 5.x writes `rope_parameters.rope_theta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default = "d_true")]
    pub tie_word_embeddings: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<Value>,
    #[serde(default = "d_act")]
    pub hidden_act: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

fn d_max_pos() -> usize {
    32768
}
fn d_eps() -> f64 {
    1e-6
}
fn d_true() -> bool {
    true
}
fn d_act() -> String {
    "silu".into()
}

/// Why a config cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("config.json: {0}")]
pub struct ConfigError(pub String);

impl Qwen2Config {
    /// Reads and checks a config.json.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let c: Qwen2Config = serde_json::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        c.check()?;
        Ok(c)
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(t) = self.extra.get("model_type").and_then(Value::as_str) {
            if t != "qwen2" {
                return Err(ConfigError(format!("model_type is '{t}', expected 'qwen2'")));
            }
        }
        if self.hidden_act != "silu" {
            return Err(ConfigError(format!("hidden_act is '{}', only 'silu' is implemented", self.hidden_act)));
        }
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return Err(ConfigError("attention heads must be positive".into()));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(ConfigError(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ConfigError("hidden_size must be a multiple of num_attention_heads".into()));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(ConfigError("head_dim must be even for rotary embeddings".into()));
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The rotary base, wherever this transformers version wrote it.
    pub fn rope_theta(&self) -> f64 {
        self.rope_theta
            .or_else(|| self.extra.get("rope_parameters").and_then(|p| p.get("rope_theta")).and_then(Value::as_f64))
            .unwrap_or(10000.0)
    }

    /// The number of unique parameters (a tied LM head counts once).
    pub fn parameter_count(&self) -> u64 {
        let (h, i, v) = (self.hidden_size as u64, self.intermediate_size as u64, self.vocab_size as u64);
        let q_dim = (self.num_attention_heads * self.head_dim()) as u64;
        let kv_dim = (self.num_key_value_heads * self.head_dim()) as u64;
        let attention = h * q_dim + q_dim + 2 * (h * kv_dim + kv_dim) + q_dim * h;
        let mlp = 3 * h * i;
        let norms = 2 * h;
        let layers = self.num_hidden_layers as u64 * (attention + mlp + norms);
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + layers + h + head
    }

    /// The config as written to `config.json`.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("config serializes");
        text.push('\n');
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-0.5B-Instruct's config.json (revision 7ae557604adf67be50417f59c2c2f167def9a775).
    pub const QWEN25_05B: &str = r#"{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
      "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
      "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
      "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936}"#;

    #[test]
    fn the_05b_config_has_the_protocols_parameter_count() {
        let c = Qwen2Config::from_json(QWEN25_05B).unwrap();
        assert_eq!(c.parameter_count(), 494_032_768);
        assert_eq!(c.head_dim(), 64);
        assert_eq!(c.rope_theta(), 1_000_000.0);
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let c = Qwen2Config::from_json(QWEN25_05B).unwrap();
        let back: Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back["sliding_window"], 32768);
        assert_eq!(back["torch_dtype"], "bfloat16");
    }

    #[test]
    fn a_bad_config_says_why() {
        let text = QWEN25_05B.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        let err = Qwen2Config::from_json(&text).unwrap_err().to_string();
        assert!(err.contains("multiple of num_key_value_heads"), "{err}");
        let text = QWEN25_05B.replace("\"model_type\": \"qwen2\"", "\"model_type\": \"llama\"");
        assert!(Qwen2Config::from_json(&text).is_err());
    }
}
