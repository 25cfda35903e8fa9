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
}

/// A decoded response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub text: String,
    /// Generated ids the tokenizer has no token for (the response is invalid then).
    pub undecodable: Vec<u32>,
}

impl TextTokenizer {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = Tokenizer::from_file(path).map_err(|e| TokenizerError(format!("{}: {e}", path.display())))?;
        let vocab_size = inner.get_vocab_size(true) as u32;
        Ok(TextTokenizer { inner, vocab_size })
    }

    /// Encodes text exactly (special tokens in the text are recognized, none are added).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(err)?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// The end-of-sequence id of a chat model (`<|im_end|>`).
    pub fn eos_id(&self) -> Result<i64, TokenizerError> {
        self.token_id(IM_END).ok_or_else(|| TokenizerError(format!("no {IM_END} token")))
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
