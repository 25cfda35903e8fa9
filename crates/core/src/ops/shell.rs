//! `shell`: a command with declared file deps and outs, like a DVC stage.

use std::collections::BTreeMap;
use std::process::Command;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Op, OpError, OutputDecl, ParamError, Role, RunContext};

/// Params of the `shell` op.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellParams {
    /// Run with `sh -c` in the spec's folder. Inputs are in the environment as
    /// `ORCHESTRATE_INPUT_<NAME>` (paths, space-separated for lists). The
    /// program it runs (`python3 train.py`, `python3 -m tools.gen`,
    /// `./score.sh`) is in the node key, as a dep would be.
    pub cmd: String,
    /// Files the command reads, relative to the spec's folder: a file, a folder
    /// (every file in it is in the key) or a glob (`data/*.jsonl`; `**` crosses
    /// folders), expanded when the spec is read. Their content is in the node
    /// key; a dep that another node writes makes an edge to it.
    #[serde(default)]
    pub deps: Vec<String>,
    /// Files or folders the command writes, relative to the spec's folder. Each
    /// is removed whole before the command runs and must exist when it ends; a
    /// folder is stored as a tree (a link inside it is refused). Other nodes
    /// refer to one as `NODE:PATH`.
    #[serde(default)]
    pub outs: Vec<String>,
    /// Params files and the dotted keys the command reads from each, as DVC's
    /// `params:` (`{params.yaml: [train.lr, train.epochs]}`; YAML, JSON or
    /// TOML by extension). Only these keys' values are in the node key, so an
    /// edit elsewhere in the file re-runs nothing; `explain` names the key
    /// (`params.yaml:train.lr: 0.01 → 0.02`). `${param:train.lr}` (or
    /// `${param:params.yaml:train.lr}`) in `cmd` is replaced by the value.
    #[serde(default)]
    pub params_files: BTreeMap<String, Vec<String>>,
    /// Metrics files the command writes (DVC's `metrics:`), each an out or a
    /// file inside a folder out: JSON, YAML or TOML, nested numbers named by
    /// their dotted path (`eval.mse`). `compare` shows them old → new,
    /// `compare --group-by` as mean ± std and n; a value that is not a number
    /// is `undefined` with the reason, never 0.
    #[serde(default)]
    pub metrics: Vec<String>,
    /// Step series the command writes (DVC's `plots:`), each an out or a file
    /// inside a folder out: JSON lines (`.jsonl`, one object per step with a
    /// numeric `step`) or CSV (`.csv`, a header row with a `step` column).
    /// `report` draws them (overlaid across runs), `export tensorboard` writes
    /// them; a value that is not a number is a gap, never 0.
    #[serde(default)]
    pub series: Vec<String>,
    /// Extra environment variables for the command (strings, numbers or booleans).
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    /// What the command does with data, so the compiler can refuse leaks:
    /// `training` may not read test data, `inference` may not read labels.
    #[serde(default)]
    pub role: Role,
}

/// An environment value as written in YAML.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    String(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

/// Read as the untagged enum would be, but a list or a map is refused
/// saying what a value may be (serde's untagged error named only the type:
/// "data did not match any variant of untagged enum EnvValue").
impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = EnvValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, a number or a boolean (an environment variable holds one value)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<EnvValue, E> {
                Ok(EnvValue::String(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<EnvValue, E> {
                Ok(EnvValue::Integer(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<EnvValue, E> {
                i64::try_from(v).map(EnvValue::Integer).or(Ok(EnvValue::Float(v as f64)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<EnvValue, E> {
                Ok(EnvValue::Float(v))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<EnvValue, E> {
                Ok(EnvValue::Bool(v))
            }
        }
        d.deserialize_any(Visit)
    }
}

impl std::fmt::Display for EnvValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvValue::String(s) => write!(f, "{s}"),
            EnvValue::Integer(i) => write!(f, "{i}"),
            EnvValue::Float(x) => write!(f, "{x}"),
            EnvValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

pub struct ShellOp;

pub use crate::store::fsx::normalize_rel;
use crate::store::fsx::reserved_folder;

impl Op for ShellOp {
    fn name(&self) -> &'static str {
        "shell"
    }
    fn version(&self) -> u32 {
        1
    }
    fn summary(&self) -> &'static str {
        "run a command with declared deps and outs (like a DVC stage)"
    }
    type Params = ShellParams;
    fn check(&self, p: &Self::Params) -> Result<(), ParamError> {
        for (field, list) in [("deps", &p.deps), ("outs", &p.outs)] {
            for (i, path) in list.iter().enumerate() {
                if normalize_rel(path).is_none() {
                    return Err(ParamError {
                        path: vec![field.to_string(), i.to_string()],
                        message: format!(
                            "'{path}' must be a relative path inside the spec's folder (no leading '/', no escaping '..')"
                        ),
                        unknown_key: false,
                    });
                }
            }
        }
        // An out is removed whole before the command runs: never one of
        // version control's folders, DVC's or ours, nor inside one.
        for (i, out) in p.outs.iter().enumerate() {
            let rel = normalize_rel(out).unwrap_or_default();
            if let Some((name, whose)) = rel.split('/').find_map(|part| Some((part, reserved_folder(part)?))) {
                return Err(ParamError {
                    path: vec!["outs".into(), i.to_string()],
                    message: format!(
                        "out '{out}' is or lies inside {whose} ('{name}'); orchestrate never removes or writes it \
                         (an out is removed whole before the command runs). Write the node's files elsewhere"
                    ),
                    unknown_key: false,
                });
            }
        }
        for (file, keys) in &p.params_files {
            let err = |message: String| ParamError {
                path: vec!["params_files".into(), file.clone()],
                message,
                unknown_key: false,
            };
            if normalize_rel(file).is_none() {
                return Err(err(format!(
                    "'{file}' must be a relative path inside the spec's folder (no leading '/', no escaping '..')"
                )));
            }
            if crate::docfile::Format::of(file).is_none() {
                return Err(err(format!("'{file}': expected a .yaml, .yml, .json or .toml params file")));
            }
            if keys.is_empty() {
                return Err(err(format!("params file '{file}' names no key; list the keys the command reads")));
            }
            if let Some(k) = keys.iter().find(|k| k.is_empty() || k.split('.').any(str::is_empty)) {
                return Err(err(format!("'{k}' is not a dotted key (such as train.lr)")));
            }
        }
        let outs: Vec<String> = p.outs.iter().filter_map(|o| normalize_rel(o)).collect();
        type Kind<'a> = (&'a str, &'a Vec<String>, fn(&str) -> bool, &'a str);
        let kinds: [Kind<'_>; 2] = [
            (
                "metrics",
                &p.metrics,
                |f| crate::docfile::Format::of(f).is_some(),
                "a .json, .yaml, .yml or .toml metrics file",
            ),
            (
                "series",
                &p.series,
                |f| crate::docfile::SeriesFormat::of(f).is_some(),
                "a .jsonl, .ndjson or .csv series file",
            ),
        ];
        for (field, list, format_ok, expected) in kinds {
            for (i, m) in list.iter().enumerate() {
                let err = |message: String| ParamError {
                    path: vec![field.into(), i.to_string()],
                    message,
                    unknown_key: false,
                };
                let Some(rel) = normalize_rel(m) else {
                    return Err(err(format!(
                        "'{m}' must be a relative path inside the spec's folder (no leading '/', no escaping '..')"
                    )));
                };
                if !format_ok(&rel) {
                    return Err(err(format!("'{m}': expected {expected}")));
                }
                if holding_out(&outs, &rel).is_none() {
                    return Err(err(format!(
                        "{field} file '{m}' is not among outs: list it (or the folder it is written in) in outs, so it is stored with the node"
                    )));
                }
            }
        }
        let cmd_error = |message: String| ParamError { path: vec!["cmd".into()], message, unknown_key: false };
        let (references, _) = scan_params(&p.cmd).map_err(cmd_error)?;
        for (_, reference) in references {
            resolve_param(&p.params_files, reference).map_err(cmd_error)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, out) in p.outs.iter().enumerate() {
            if !seen.insert(normalize_rel(out)) {
                return Err(ParamError {
                    path: vec!["outs".into(), i.to_string()],
                    message: format!("out '{out}' is declared twice"),
                    unknown_key: false,
                });
            }
        }
        Ok(())
    }
    fn outputs(&self, params: &Self::Params) -> Vec<OutputDecl> {
        params
            .outs
            .iter()
            .filter_map(|o| normalize_rel(o))
            .map(|o| OutputDecl { workspace_path: Some(o.clone()), ..OutputDecl::file(o) })
            .collect()
    }
    fn role(&self, params: &Self::Params) -> Role {
        params.role
    }
    fn file_deps(&self, params: &Self::Params, _spec_dir: &std::path::Path) -> Vec<String> {
        params.deps.iter().filter_map(|d| normalize_rel(d)).collect()
    }
    fn command_reads(&self, params: &Self::Params, spec_dir: &std::path::Path) -> super::CommandReads {
        super::programs::command_reads(&params.cmd, spec_dir)
    }
    fn params_files(&self, params: &Self::Params) -> Vec<(String, Vec<String>)> {
        params.params_files.iter().filter_map(|(f, keys)| Some((normalize_rel(f)?, keys.clone()))).collect()
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        let command = substitute_params(&p.cmd, &p.params_files, ctx.params_values).map_err(OpError::Failed)?;
        // Stale outs from an earlier run must not pass for fresh ones: each is
        // removed whole, a folder with every file in it (DVC does the same).
        // Never the store's folder, nor a folder holding it (`run` refuses
        // such a spec before any node starts; this holds for every caller).
        let outs: Vec<String> = p.outs.iter().filter_map(|o| normalize_rel(o)).collect();
        crate::store::fsx::OutsBeside::new(ctx.spec_dir, ctx.workspace)
            .and_then(|beside| beside.check(&outs))
            .map_err(|e| OpError::Failed(e.to_string()))?;
        for out in outs {
            let path = ctx.spec_dir.join(&out);
            crate::store::fsx::remove_out(ctx.spec_dir, &out)
                .map_err(|e| OpError::io(format!("removing stale out {}", path.display()), e))?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| OpError::io(format!("creating {}", parent.display()), e))?;
            }
        }
        // A node that sets its own PATH finds `sh` on it, as before.
        let mut cmd = Command::new(if p.env.contains_key("PATH") { "sh".as_ref() } else { super::process::sh() });
        // The script waits at its gate until the watchdog holds its group.
        cmd.arg("-c").arg(super::process::shell_gate(&command)).current_dir(ctx.spec_dir);
        cmd.env("ORCHESTRATE_NODE", ctx.node_id);
        for (name, artifacts) in ctx.inputs {
            let paths: Vec<String> = artifacts.iter().map(|a| a.path.display().to_string()).collect();
            cmd.env(format!("ORCHESTRATE_INPUT_{}", env_name(name)), paths.join(" "));
        }
        cmd.envs(p.env.iter().map(|(k, v)| (k, v.to_string())));
        let mut child = super::process::spawn_tied(&mut cmd, ctx.log_path)
            .map_err(|e| OpError::io(format!("starting sh (log {})", ctx.log_path.display()), e))?;
        child.open_gate().map_err(|e| OpError::io(format!("starting sh (log {})", ctx.log_path.display()), e))?;
        // As Snakemake does: outs a failed or interrupted command wrote are
        // incomplete, and are removed (stale ones were removed before it ran).
        // This also frees a full disk, so the log and the run's record can be written.
        let remove_outs = || {
            let mut removed = Vec::new();
            for out in p.outs.iter().filter_map(|o| normalize_rel(o)) {
                if crate::store::fsx::remove_out(ctx.spec_dir, &out).unwrap_or(false) {
                    removed.push(out);
                }
            }
            removed
        };
        let finished = match child.wait(ctx.cancel) {
            Ok(f) => f,
            Err(e) => {
                remove_outs();
                return Err(e);
            }
        };
        if !finished.status.success() {
            let removed = remove_outs();
            finished.output.complete_log();
            let code = super::process::describe(finished.status);
            let removed = if removed.is_empty() {
                String::new()
            } else {
                format!(" (its incomplete outs were removed: {})", removed.join(", "))
            };
            return Err(OpError::Failed(format!(
                "command failed with {code}{removed}{}",
                finished.output.last_lines(10)
            )));
        }
        for out in p.outs.iter().filter_map(|o| normalize_rel(o)) {
            match std::fs::symlink_metadata(ctx.spec_dir.join(&out)) {
                Ok(m) if m.is_file() || m.is_dir() => {}
                Ok(_) => {
                    remove_outs();
                    return Err(OpError::Failed(format!(
                        "the command wrote its out '{out}' as a symbolic link; outs are stored from real files and folders only"
                    )));
                }
                Err(_) => {
                    return Err(OpError::Failed(format!(
                        "the command succeeded but did not write declared out '{out}'"
                    )))
                }
            }
        }
        Ok(())
    }
}

impl ShellParams {
    /// Each declared metrics file: (its path as declared, the out that holds
    /// it, its path inside that out: empty when the out is the file itself).
    pub fn metrics_files(&self) -> Vec<(String, String, String)> {
        self.files_in_outs(&self.metrics)
    }

    /// Each declared series file, as [`ShellParams::metrics_files`].
    pub fn series_files(&self) -> Vec<(String, String, String)> {
        self.files_in_outs(&self.series)
    }

    fn files_in_outs(&self, files: &[String]) -> Vec<(String, String, String)> {
        let outs: Vec<String> = self.outs.iter().filter_map(|o| normalize_rel(o)).collect();
        files
            .iter()
            .filter_map(|m| {
                let rel = normalize_rel(m)?;
                let out = holding_out(&outs, &rel)?;
                let inside = rel.strip_prefix(out).unwrap_or("").trim_start_matches('/').to_string();
                Some((rel.clone(), out.to_string(), inside))
            })
            .collect()
    }
}

/// The out that is `rel` or holds it as a folder, if any.
fn holding_out<'a>(outs: &'a [String], rel: &str) -> Option<&'a str> {
    outs.iter().map(String::as_str).find(|o| crate::store::fsx::at_or_inside(rel, o))
}

/// A command cut at its `${param:…}` references: (the text before each,
/// the reference), and the text after the last.
type Scanned<'a> = (Vec<(&'a str, &'a str)>, &'a str);

/// [`Scanned`] of a command; `Err` names an unclosed reference.
fn scan_params(cmd: &str) -> Result<Scanned<'_>, String> {
    let mut out = Vec::new();
    let mut rest = cmd;
    while let Some(at) = rest.find("${param:") {
        let after = &rest[at + "${param:".len()..];
        let end = after.find('}').ok_or_else(|| format!("an unclosed ${{param:{after}"))?;
        out.push((&rest[..at], &after[..end]));
        rest = &after[end + 1..];
    }
    Ok((out, rest))
}

/// The (file, key) a `${param:…}` reference names: `FILE:KEY`, or a `KEY`
/// exactly one params file lists.
fn resolve_param<'a>(
    files: &'a BTreeMap<String, Vec<String>>,
    reference: &'a str,
) -> Result<(String, &'a str), String> {
    if let Some((file, key)) = reference.split_once(crate::docfile::PARAMS_KEY_SEP) {
        return match files.iter().find(|(f, _)| normalize_rel(f).as_deref() == normalize_rel(file).as_deref()) {
            Some((f, keys)) if keys.iter().any(|k| k == key) => Ok((normalize_rel(f).unwrap_or_default(), key)),
            Some(_) => Err(format!("${{param:{reference}}}: '{key}' is not among the keys params_files lists for '{file}'; add it there so its value is in the key")),
            None => Err(format!("${{param:{reference}}}: '{file}' is not a file in params_files")),
        };
    }
    let holders: Vec<&String> =
        files.iter().filter(|(_, keys)| keys.iter().any(|k| k == reference)).map(|(f, _)| f).collect();
    match holders.as_slice() {
        [one] => Ok((normalize_rel(one).unwrap_or_default(), reference)),
        [] => Err(format!(
            "${{param:{reference}}}: no params file in params_files lists the key '{reference}'; add it there so its value is in the key"
        )),
        many => Err(format!(
            "${{param:{reference}}}: the key is listed for {} files; write ${{param:FILE:{reference}}}",
            many.iter().map(|f| format!("'{f}'")).collect::<Vec<_>>().join(" and ")
        )),
    }
}

/// `cmd` with each `${param:…}` replaced by the value the node's key was
/// computed with: a number or boolean as written, a string as a shell word
/// (single-quoted unless it is plain), anything else as canonical JSON, quoted.
fn substitute_params(
    cmd: &str,
    files: &BTreeMap<String, Vec<String>>,
    values: &BTreeMap<String, BTreeMap<String, serde_json::Value>>,
) -> Result<String, String> {
    let (references, tail) = scan_params(cmd)?;
    let mut out = String::with_capacity(cmd.len());
    for (before, reference) in references {
        out.push_str(before);
        let (file, key) = resolve_param(files, reference)?;
        let v = values
            .get(&file)
            .and_then(|m| m.get(key))
            .ok_or_else(|| format!("${{param:{reference}}}: the value of {file}:{key} was not read into the key"))?;
        out.push_str(&shell_word(v));
    }
    out.push_str(tail);
    Ok(out)
}

fn shell_word(v: &serde_json::Value) -> String {
    let text = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(_) | serde_json::Value::Bool(_) => return crate::canonical::canonical_json(v),
        other => crate::canonical::canonical_json(other),
    };
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '/' | ',' | '=' | ':'));
    if plain {
        text
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

fn env_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An env value reads as the untagged enum read it, and a list or a map
    /// is refused saying what a value may be, not naming a Rust type.
    #[test]
    fn an_env_value_is_one_scalar_and_anything_else_says_so() {
        let read = |v: serde_json::Value| serde_json::from_value::<EnvValue>(v);
        assert!(matches!(read(serde_json::json!("a")).unwrap(), EnvValue::String(s) if s == "a"));
        assert!(matches!(read(serde_json::json!(-3)).unwrap(), EnvValue::Integer(-3)));
        assert!(matches!(read(serde_json::json!(u64::MAX)).unwrap(), EnvValue::Float(_)));
        assert!(matches!(read(serde_json::json!(0.5)).unwrap(), EnvValue::Float(x) if x == 0.5));
        assert!(matches!(read(serde_json::json!(true)).unwrap(), EnvValue::Bool(true)));
        for bad in [serde_json::json!([1, 2]), serde_json::json!({"a": 1}), serde_json::Value::Null] {
            let e = read(bad.clone()).unwrap_err().to_string();
            assert!(e.contains("expected a string, a number or a boolean") && !e.contains("EnvValue"), "{bad}: {e}");
        }
    }

    #[test]
    fn normalize_rel_folds_dots_and_refuses_escapes() {
        assert_eq!(normalize_rel("./a/../b/c.txt").as_deref(), Some("b/c.txt"));
        assert_eq!(normalize_rel("a//b").as_deref(), Some("a/b"));
        assert_eq!(normalize_rel("../x"), None);
        assert_eq!(normalize_rel("/etc/passwd"), None);
        assert_eq!(normalize_rel("."), None);
    }

    #[test]
    fn param_references_resolve_to_the_keys_values_and_strings_are_quoted() {
        let files: BTreeMap<String, Vec<String>> =
            [("params.yaml".to_string(), vec!["train.lr".to_string(), "name".to_string()])].into();
        let values: BTreeMap<String, BTreeMap<String, serde_json::Value>> = [(
            "params.yaml".to_string(),
            [("train.lr".to_string(), serde_json::json!(0.02)), ("name".to_string(), serde_json::json!("a b'c"))]
                .into(),
        )]
        .into();
        let cmd = substitute_params("t --lr ${param:train.lr} --n ${param:params.yaml:name}", &files, &values).unwrap();
        assert_eq!(cmd, r#"t --lr 0.02 --n 'a b'\''c'"#);
        let e = resolve_param(&files, "train.epochs").unwrap_err();
        assert!(e.contains("no params file in params_files lists the key 'train.epochs'"), "{e}");
        let e = resolve_param(&files, "other.yaml:train.lr").unwrap_err();
        assert!(e.contains("'other.yaml' is not a file in params_files"), "{e}");
    }

    #[test]
    fn unknown_param_names_the_nearest_valid_one() {
        let err = crate::ops::AnyOp::parse(&ShellOp, &serde_json::json!({"cmd": "true", "out": ["x"]})).unwrap_err();
        assert_eq!(err.path, vec!["out".to_string()]);
        assert!(err.message.contains("did you mean 'outs'"), "{}", err.message);
    }
}
