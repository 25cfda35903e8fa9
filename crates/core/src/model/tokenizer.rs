//! The text side of a model: encoding prompts, decoding responses (flagging ids
//! the tokenizer cannot decode), and building the embedded default's BPE.

use std::path::Path;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use super::{ENDOFTEXT, IM_END, IM_START};

#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub String);

fn err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError(e.to_string())
}

/// A loaded `tokenizer.json`.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Ids with a token (model vocabularies are often padded beyond this).
    vocab_size: u32,
    /// The end of an assistant turn, when the model folder names it
    /// (`tokenizer_config.json`'s `eos_token`); else `<|im_end|>`.
    turn_end: Option<i64>,
    /// Every id that ends a generation: the turn end, and the ids
    /// `generation_config.json` and `config.json` list as `eos_token_id`.
    stops: Vec<i64>,
}

/// A decoded response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub text: String,
    /// Generated ids the tokenizer has no token for (the response is invalid then).
    pub undecodable: Vec<u32>,
}

impl TextTokenizer {
    /// A `tokenizer.json`: a regular file of at most
    /// [`MAX_TOKENIZER_BYTES`](super::MAX_TOKENIZER_BYTES) (see [`crate::fsread::read_regular`]).
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let bytes = crate::fsread::read_regular(path, super::MAX_TOKENIZER_BYTES)
            .map_err(|e| TokenizerError(format!("{}: {e}", path.display())))?;
        let inner = Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError(format!("{}: {e}", path.display())))?;
        let vocab_size = inner.get_vocab_size(true) as u32;
        Ok(TextTokenizer { inner, vocab_size, turn_end: None, stops: Vec::new() })
    }

    /// The tokenizer of a model folder, with the end-of-turn token and the
    /// stop ids its files name: `tokenizer_config.json`'s `eos_token` (the
    /// token an assistant turn ends with, what SFT appends: `<|im_end|>` for
    /// Qwen, `<|eot_id|>` for Llama 3 Instruct), plus every `eos_token_id` of
    /// `generation_config.json` and `config.json` (transformers stops at any).
    pub fn from_model_folder(dir: &Path) -> Result<Self, TokenizerError> {
        let mut t = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let read = |name: &str| -> Result<Option<serde_json::Value>, TokenizerError> {
            let path = dir.join(name);
            match crate::fsread::read_regular_text(&path, super::MAX_JSON_BYTES) {
                Ok(text) => serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| TokenizerError(format!("{}: {e}", path.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(TokenizerError(format!("{}: {e}", path.display()))),
            }
        };
        if let Some(cfg) = read("tokenizer_config.json")? {
            let token = match cfg.get("eos_token") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
                _ => None,
            };
            if let Some(token) = token {
                let id = t.token_id(&token).ok_or_else(|| {
                    TokenizerError(format!(
                        "{}: eos_token '{token}' is not a token of tokenizer.json",
                        dir.join("tokenizer_config.json").display()
                    ))
                })?;
                t.turn_end = Some(id);
            }
        }
        let mut stops = vec![t.eos_id()?];
        for name in ["generation_config.json", "config.json"] {
            let ids = match read(name)?.as_ref().and_then(|v| v.get("eos_token_id")).cloned() {
                None | Some(serde_json::Value::Null) => Vec::new(),
                Some(serde_json::Value::Number(n)) => n.as_i64().into_iter().collect(),
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(serde_json::Value::as_i64).collect(),
                Some(other) => {
                    return Err(TokenizerError(format!(
                        "{}: eos_token_id is {other}, expected an id or a list of ids",
                        dir.join(name).display()
                    )))
                }
            };
            stops.extend(ids);
        }
        stops.sort_unstable();
        stops.dedup();
        t.stops = stops;
        Ok(t)
    }

    /// Every id that ends a generation (at least [`Self::eos_id`]).
    pub fn stop_ids(&self) -> Vec<i64> {
        if self.stops.is_empty() {
            self.eos_id().into_iter().collect()
        } else {
            self.stops.clone()
        }
    }

    /// Encodes text exactly (special tokens in the text are recognized, none are added).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(err)?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// The id an assistant turn ends with: the model folder's `eos_token`
    /// ([`Self::from_model_folder`]), else ChatML's `<|im_end|>`.
    pub fn eos_id(&self) -> Result<i64, TokenizerError> {
        match self.turn_end {
            Some(id) => Ok(id),
            None => self.token_id(IM_END).ok_or_else(|| {
                TokenizerError(format!(
                    "no {IM_END} token, and no tokenizer_config.json naming the eos_token an assistant turn ends with"
                ))
            }),
        }
    }

    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// Decodes generated ids, keeping special tokens; ids without a token are
    /// reported, never silently dropped.
    pub fn decode(&self, ids: &[i64]) -> Result<Decoded, TokenizerError> {
        let mut known = Vec::with_capacity(ids.len());
        let mut undecodable = Vec::new();
        for &id in ids {
            match u32::try_from(id) {
                Ok(u) if self.inner.id_to_token(u).is_some() => known.push(u),
                _ => undecodable.push(id.clamp(0, i64::from(u32::MAX)) as u32),
            }
        }
        let text = self.inner.decode(&known, false).map_err(err)?;
        Ok(Decoded { text, undecodable })
    }
}

/// Qwen2's pre-tokenization regex (its `tokenizer.json` and transformers'
/// `tokenization_qwen2.py`): `\p{N}` stands alone, so every digit is a token
/// of its own and BPE never merges a number into one token.
pub const QWEN2_PRETOKENIZE_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Trains a byte-level BPE with ChatML special tokens on `texts` and writes
/// `tokenizer.json` (loadable by Hugging Face `tokenizers` and `transformers`).
/// It is built as Qwen2's is: NFC, then the [`QWEN2_PRETOKENIZE_REGEX`]
/// split (isolated), then byte-level without a regex of its own.
pub fn build_bpe(texts: &[String], vocab_size: usize, out: &Path) -> Result<(), TokenizerError> {
    let specials: Vec<AddedToken> =
        [ENDOFTEXT, IM_START, IM_END].iter().map(|t| AddedToken::from(t.to_string(), true)).collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let split =
        Split::new(SplitPattern::Regex(QWEN2_PRETOKENIZE_REGEX.into()), SplitDelimiterBehavior::Isolated, false)
            .map_err(err)?;
    let pre = Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]);
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(pre))
        .with_post_processor(Some(ByteLevel::new(false, false, false)))
        .with_decoder(Some(ByteLevel::new(false, false, false)))
        .build()
        .map_err(err)?;
    tokenizer.train(&mut trainer, texts.iter()).map_err(err)?;
    let mut tokenizer: Tokenizer = tokenizer.into();
    tokenizer.add_special_tokens(&specials);
    tokenizer.save(out, true).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<String> {
        (0..200)
            .map(|i| {
                format!("A warehouse holds {i} boxes. Two deliveries arrive. {{\"final_stock\": {}}}", i * 3 % 301)
            })
            .collect()
    }

    #[test]
    fn a_built_tokenizer_round_trips_text_and_keeps_special_tokens_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        build_bpe(&corpus(), 300, &path).unwrap();
        let t = TextTokenizer::from_file(&path).unwrap();
        let text = "<|im_start|>user\nA warehouse holds 7 boxes.<|im_end|>\n";
        let ids = t.encode(text).unwrap();
        assert_eq!(ids[0], t.token_id(IM_START).unwrap());
        assert!(ids.contains(&t.eos_id().unwrap()));
        assert_eq!(t.decode(&ids).unwrap(), Decoded { text: text.into(), undecodable: vec![] });
        // Any byte sequence encodes: the byte-level alphabet is complete.
        let odd = "ünïcödé ✓ {\"final_stock\": 12}";
        assert_eq!(t.decode(&t.encode(odd).unwrap()).unwrap().text, odd);
    }

    #[test]
    fn ids_beyond_the_vocabulary_are_flagged_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        build_bpe(&corpus(), 300, &path).unwrap();
        let t = TextTokenizer::from_file(&path).unwrap();
        let mut ids = t.encode("boxes").unwrap();
        let beyond = i64::from(t.vocab_size()) + 5;
        ids.push(beyond);
        let d = t.decode(&ids).unwrap();
        assert_eq!(d.text, "boxes");
        assert_eq!(d.undecodable, vec![beyond as u32]);
    }

    #[test]
    fn every_digit_is_a_token_of_its_own_as_in_qwen2() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        build_bpe(&corpus(), 300, &path).unwrap();
        let t = TextTokenizer::from_file(&path).unwrap();
        // The corpus repeats numbers up to 300 hundreds of times: a GPT-2
        // pre-tokenizer merges them into tokens such as "Ġ55".
        for (token, _) in t.inner.get_vocab(false) {
            assert!(token.chars().filter(char::is_ascii_digit).count() <= 1, "a multi-digit token: {token:?}");
        }
        let ids = t.encode("holds 1234 boxes").unwrap();
        let pieces: Vec<String> = ids.iter().map(|&i| t.decode(&[i]).unwrap().text).collect();
        assert!(pieces.windows(4).any(|w| w == ["1", "2", "3", "4"]), "{pieces:?}");
    }

    #[test]
    fn the_same_corpus_gives_the_same_tokenizer_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
        build_bpe(&corpus(), 300, &a).unwrap();
        build_bpe(&corpus(), 300, &b).unwrap();
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
}
