//! Chat templates: how a system message and a user message become the prompt
//! text a model is given. A model folder's own template (the `chat_template`
//! of `tokenizer_config.json`, or `chat_template.jinja`) is rendered with
//! minijinja the way transformers' `apply_chat_template` renders it (blocks
//! trimmed, Python string methods, `raise_exception`); a folder without one
//! (the embedded default) gets the built-in ChatML, [`chat_prompt`].
//! `tests/it/model.rs` checks token-id parity with transformers for Qwen2.5's
//! template, a Llama-3 one and the embedded default's.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::chat_prompt;

/// The built-in ChatML as a Jinja template: what [`chat_prompt`] writes, for
/// a tokenizer that needs it spelled out (the parity test hands it to
/// transformers).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The files of a model folder a chat template is read from: what
/// `model.import`, `model.hub` and a trained model's folder carry along.
pub const TEMPLATE_FILES: [&str; 2] = ["tokenizer_config.json", "chat_template.jinja"];

/// The largest template read (1 MiB); real ones are a few KiB.
const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// Which chat template a node renders prompts with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TemplateChoice {
    /// The model folder's own (`tokenizer_config.json`'s `chat_template`, or
    /// `chat_template.jinja`); the built-in ChatML when it ships none.
    #[default]
    Model,
    /// The built-in ChatML, whatever the model ships.
    Chatml,
}

impl TemplateChoice {
    /// Whether this is the default (left out of resolved params, so of keys).
    pub fn is_default(&self) -> bool {
        *self == TemplateChoice::Model
    }
}

/// What one render of a model's chat template may spend (minijinja's fuel:
/// an instruction, or about 64 bytes of data, per unit): 10 million, about a
/// second of a looping template or 640 MB of text. A real template spends a
/// few hundred plus the messages' length (a 4 MiB statement, the largest a
/// page holds, about 70 thousand).
pub const CHAT_TEMPLATE_FUEL: u64 = 10_000_000;

/// A template that cannot be read or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChatError(pub String);

enum Kind {
    ChatMl,
    Jinja { env: Box<minijinja::Environment<'static>>, bos: String, eos: String },
}

/// A chat template, ready to render.
pub struct ChatTemplate {
    kind: Kind,
    /// Where it came from, for errors and records.
    pub source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).finish()
    }
}

/// A special token of `tokenizer_config.json`: a string, or an AddedToken
/// object with its `content`.
fn token_text(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

fn read_bounded(path: &Path) -> Result<String, ChatError> {
    // A regular file (a FIFO is refused, not waited on), through links.
    crate::fsread::read_regular_text(path, MAX_TEMPLATE_BYTES)
        .map_err(|e| ChatError(format!("{}: {e}", path.display())))
}

impl ChatTemplate {
    /// The built-in ChatML.
    pub fn chatml() -> Self {
        ChatTemplate { kind: Kind::ChatMl, source: "built-in ChatML".into() }
    }

    /// A model folder's template, as `choice` says: its own (`chat_template`
    /// of `tokenizer_config.json`, a string or the `default` of a named list;
    /// else `chat_template.jinja`), or ChatML when it ships none.
    pub fn of_folder(dir: &Path, choice: TemplateChoice) -> Result<Self, ChatError> {
        if choice == TemplateChoice::Chatml {
            return Ok(Self::chatml());
        }
        let config_path = dir.join(TEMPLATE_FILES[0]);
        let config: serde_json::Value = if config_path.is_file() {
            serde_json::from_str(&read_bounded(&config_path)?)
                .map_err(|e| ChatError(format!("{}: not JSON: {e}", config_path.display())))?
        } else {
            serde_json::Value::Null
        };
        let (bos, eos) = (token_text(config.get("bos_token")), token_text(config.get("eos_token")));
        let inline = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(named)) => {
                let default = named.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                let t = default.and_then(|t| t.get("template")).and_then(|t| t.as_str()).ok_or_else(|| {
                    ChatError(format!(
                        "{}: chat_template is a list without a 'default' template",
                        config_path.display()
                    ))
                })?;
                Some(t.to_string())
            }
            Some(_) => {
                return Err(ChatError(format!(
                    "{}: chat_template is neither a string nor a list of named templates",
                    config_path.display()
                )))
            }
        };
        let jinja_path = dir.join(TEMPLATE_FILES[1]);
        let (text, source) = match inline {
            Some(t) => (t, format!("{} (chat_template)", config_path.display())),
            None if jinja_path.is_file() => (read_bounded(&jinja_path)?, jinja_path.display().to_string()),
            None => return Ok(Self::chatml()),
        };
        Self::from_jinja(&text, &bos, &eos, &source)
    }

    /// A Jinja template, compiled as transformers compiles it.
    pub fn from_jinja(text: &str, bos: &str, eos: &str, source: &str) -> Result<Self, ChatError> {
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError(e.to_string()))?;
        env.set_syntax(syntax);
        // The template comes from a model folder, so from outside: each render
        // has a budget (instructions, and about 64 bytes of data per unit) and
        // fails past it, never looping or growing for ever.
        env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
        });
        // Templates that print today's date get a fixed one: a prompt must not
        // depend on when it was rendered (the key would not say).
        env.add_function("strftime_now", |_format: String| -> String { "26 Jul 2024".to_string() });
        env.add_template_owned("chat", text.to_string())
            .map_err(|e| ChatError(format!("{source}: not a template minijinja compiles: {e}")))?;
        Ok(ChatTemplate {
            kind: Kind::Jinja { env: Box::new(env), bos: bos.to_string(), eos: eos.to_string() },
            source: source.to_string(),
        })
    }

    /// Whether the model's own template is used (not the built-in ChatML).
    pub fn is_model_template(&self) -> bool {
        matches!(self.kind, Kind::Jinja { .. })
    }

    /// The prompt for a system message (none when empty, so a template's own
    /// default applies) and a user message, with the generation prompt.
    pub fn render(&self, system: &str, user: &str) -> Result<String, ChatError> {
        match &self.kind {
            Kind::ChatMl => Ok(chat_prompt(system, user)),
            Kind::Jinja { env, bos, eos } => {
                let mut messages = Vec::new();
                if !system.is_empty() {
                    messages.push(minijinja::context! { role => "system", content => system });
                }
                messages.push(minijinja::context! { role => "user", content => user });
                let template = env.get_template("chat").map_err(|e| ChatError(e.to_string()))?;
                template
                    .render(minijinja::context! {
                        messages => messages,
                        add_generation_prompt => true,
                        bos_token => bos,
                        eos_token => eos,
                    })
                    .map_err(|e| ChatError(format!("{}: rendering the chat template: {e}", self.source)))
            }
        }
    }
}

/// The user message for a statement: `prompt_template` with `{prompt}`
/// standing for it, or the statement itself.
pub fn user_message(prompt_template: Option<&str>, statement: &str) -> String {
    match prompt_template {
        Some(t) => t.replace(PROMPT_PLACEHOLDER, statement),
        None => statement.to_string(),
    }
}

/// What a `prompt_template` writes for the statement.
pub const PROMPT_PLACEHOLDER: &str = "{prompt}";

/// Checks a `prompt_template` param: it must place the statement.
pub fn check_prompt_template(t: &str) -> Result<(), ChatError> {
    if !t.contains(PROMPT_PLACEHOLDER) {
        return Err(ChatError(format!(
            "'{t}' does not contain {PROMPT_PLACEHOLDER}, where each problem's statement goes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chatml_jinja_template_renders_what_the_built_in_chatml_writes() {
        let t = ChatTemplate::from_jinja(CHATML_TEMPLATE, "", "", "test").unwrap();
        for (system, user) in [("sys", "hi"), ("You answer.", "two\nlines {x} <b>"), ("s", " padded ")] {
            assert_eq!(t.render(system, user).unwrap(), chat_prompt(system, user));
        }
    }

    #[test]
    fn a_folder_without_a_template_gets_chatml_and_one_with_its_own_uses_it() {
        let dir = tempfile::tempdir().unwrap();
        let t = ChatTemplate::of_folder(dir.path(), TemplateChoice::Model).unwrap();
        assert!(!t.is_model_template());
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            serde_json::json!({"bos_token": {"content": "<s>"}, "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content | trim }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"}).to_string(),
        )
        .unwrap();
        let t = ChatTemplate::of_folder(dir.path(), TemplateChoice::Model).unwrap();
        assert_eq!(t.render("", "  hi ").unwrap(), "<s>[user:hi]>");
        assert_eq!(t.render("s", "u").unwrap(), "<s>[system:s][user:u]>");
        let forced = ChatTemplate::of_folder(dir.path(), TemplateChoice::Chatml).unwrap();
        assert_eq!(forced.render("s", "u").unwrap(), chat_prompt("s", "u"));
        // raise_exception is an error naming the template, not a panic or an empty prompt.
        let t = ChatTemplate::from_jinja("{{ raise_exception('no system role') }}", "", "", "x.json").unwrap();
        assert!(t.render("", "u").unwrap_err().0.contains("no system role"));
        assert!(ChatTemplate::from_jinja("{% if %}", "", "", "bad.json").unwrap_err().0.contains("bad.json"));
    }

    /// A model folder's chat template is a program from outside: one that
    /// loops without end (here 10^10 steps; `range` alone stops at 10^5) or
    /// builds an endless string rendered for ever and grew without bound.
    /// A render now has a budget and fails naming the template; a real
    /// template with a 4 MiB statement stays far inside it.
    #[test]
    fn a_chat_template_that_would_run_for_ever_fails_naming_the_template() {
        let render = |text: &'static str, user: String| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let t = ChatTemplate::from_jinja(text, "", "", "hostile/tokenizer_config.json").unwrap();
                let _ = tx.send(t.render("s", &user));
            });
            rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the render ended within 20 s")
        };
        for hostile in [
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
            "{% set s = namespace(t='x') %}{% for a in range(100000) %}{% set s.t = s.t ~ s.t %}{% endfor %}{{ s.t }}",
        ] {
            let e = render(hostile, "u".into()).unwrap_err();
            assert!(e.0.contains("hostile/tokenizer_config.json") && e.0.contains("fuel"), "{e}");
        }
        let big = "y".repeat(4 << 20);
        let rendered = render(CHATML_TEMPLATE, big.clone()).unwrap();
        assert!(rendered == chat_prompt("s", &big), "a 4 MiB statement rendered as {} bytes", rendered.len());
    }

    #[test]
    fn a_prompt_template_places_the_statement() {
        assert_eq!(user_message(Some("Q: {prompt}\nA:"), "2+2?"), "Q: 2+2?\nA:");
        assert_eq!(user_message(None, "2+2?"), "2+2?");
        assert!(check_prompt_template("no placeholder").is_err());
    }
}
