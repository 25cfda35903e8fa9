//! Did-you-mean suggestions for names a user mistyped (ops, fields, nodes),
//! and for names written as another tool spells them (`learning_rate` for
//! `lr`, as TRL and Hugging Face write it).

/// Names that mean the same, as the tools our users come from write them
/// (TRL/transformers `TrainingArguments`, verl, DVC): a word in one group
/// suggests the candidates in the same group.
const SYNONYMS: &[&[&str]] = &[
    &["lr", "learning_rate", "learningrate", "step_size"],
    &["iterations", "num_iterations", "iters", "num_iters", "max_steps", "steps", "num_steps", "total_steps"],
    &["epochs", "num_epochs", "num_train_epochs", "n_epochs"],
    &["batch_size", "per_device_train_batch_size", "train_batch_size", "bs", "batch"],
    &["group_size", "num_generations", "g", "rollout_n", "n_samples_per_prompt"],
    &["kl_coef", "beta", "kl_beta", "kl_coeff", "init_kl_coef"],
    &["clip", "clip_range", "epsilon", "cliprange", "clip_ratio"],
    &["seed", "random_seed", "rng_seed"],
    &["max_new_tokens", "max_completion_length", "max_response_length", "response_length"],
    &["temperature", "temp", "sampling_temperature"],
    &["warmup_steps", "num_warmup_steps", "warmup"],
    &["weight_decay", "wd", "l2"],
    &["grad_clip", "max_grad_norm", "clip_grad_norm", "gradient_clipping"],
];

/// The candidate that means the same as `word` by a known synonym, if any.
pub fn synonym<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_ascii_lowercase().replace('-', "_");
    let group = SYNONYMS.iter().find(|g| g.contains(&w.as_str()))?;
    candidates.into_iter().find(|c| *c != word && group.contains(&c.to_ascii_lowercase().as_str()))
}

/// The closest of `candidates` to `word`, if it is close enough to be a
/// likely typo, or a known synonym of it.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let candidates: Vec<&'a str> = candidates.into_iter().collect();
    if let Some(s) = synonym(word, candidates.iter().copied()) {
        return Some(s);
    }
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.75)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// ", did you mean 'x'?" or nothing.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    match nearest(word, candidates) {
        Some(c) => format!(" (did you mean '{c}'?)"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_other_tools_use_suggest_ours() {
        let ours = ["lr", "iterations", "group_size", "kl_coef", "seed"];
        assert_eq!(nearest("learning_rate", ours), Some("lr"));
        assert_eq!(nearest("num_iterations", ours), Some("iterations"));
        assert_eq!(nearest("num_generations", ours), Some("group_size"));
        assert_eq!(nearest("beta", ours), Some("kl_coef"));
        // And the other way: a params file written with TRL's names.
        assert_eq!(nearest("lr", ["learning_rate", "epochs"]), Some("learning_rate"));
        // Typos still work; an unrelated word suggests nothing.
        assert_eq!(nearest("iteratons", ours), Some("iterations"));
        assert_eq!(nearest("tokenizer", ours), None);
    }
}
