//! `shell`: a command with declared file deps and outs, like a DVC stage.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Op, OpError, OutputDecl, OutputKind, ParamError, Role, RunContext};

/// Params of the `shell` op.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellParams {
    /// Run with `sh -c` in the spec's folder. Inputs are in the environment as
    /// `ORCHESTRATE_INPUT_<NAME>` (paths, space-separated for lists).
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
    /// Extra environment variables for the command (strings, numbers or booleans).
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    /// What the command does with data, so the compiler can refuse leaks:
    /// `training` may not read test data, `inference` may not read labels.
    #[serde(default)]
    pub role: Role,
}

/// An environment value as written in YAML.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    String(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
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

/// Lexically normalizes a relative path (`./a/../b` → `b`) so deps and outs
/// written differently still match; `None` if it escapes upward or is absolute.
pub fn normalize_rel(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    if path.starts_with('/') {
        return None;
    }
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

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
            .map(|o| OutputDecl { name: o.clone(), kind: OutputKind::File, workspace_path: Some(o), taint: None })
            .collect()
    }
    fn role(&self, params: &Self::Params) -> Role {
        params.role
    }
    fn file_deps(&self, params: &Self::Params, _spec_dir: &std::path::Path) -> Vec<String> {
        params.deps.iter().filter_map(|d| normalize_rel(d)).collect()
    }
    fn run(&self, p: &Self::Params, ctx: &RunContext<'_>) -> Result<(), OpError> {
        // Stale outs from an earlier run must not pass for fresh ones: each is
        // removed whole, a folder with every file in it (DVC does the same).
        for out in p.outs.iter().filter_map(|o| normalize_rel(o)) {
            let path = ctx.spec_dir.join(&out);
            crate::store::fsx::remove_out(ctx.spec_dir, &out)
                .map_err(|e| OpError::io(format!("removing stale out {}", path.display()), e))?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| OpError::io(format!("creating {}", parent.display()), e))?;
            }
        }
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(&p.cmd).current_dir(ctx.spec_dir).stdin(Stdio::null());
        cmd.env("ORCHESTRATE_NODE", ctx.node_id);
        for (name, artifacts) in ctx.inputs {
            let paths: Vec<String> = artifacts.iter().map(|a| a.path.display().to_string()).collect();
            cmd.env(format!("ORCHESTRATE_INPUT_{}", env_name(name)), paths.join(" "));
        }
        cmd.envs(p.env.iter().map(|(k, v)| (k, v.to_string())));
        let child = super::process::spawn_tied(&mut cmd, ctx.log_path)
            .map_err(|e| OpError::io(format!("starting sh (log {})", ctx.log_path.display()), e))?;
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

fn env_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_rel_folds_dots_and_refuses_escapes() {
        assert_eq!(normalize_rel("./a/../b/c.txt").as_deref(), Some("b/c.txt"));
        assert_eq!(normalize_rel("a//b").as_deref(), Some("a/b"));
        assert_eq!(normalize_rel("../x"), None);
        assert_eq!(normalize_rel("/etc/passwd"), None);
        assert_eq!(normalize_rel("."), None);
    }

    #[test]
    fn unknown_param_names_the_nearest_valid_one() {
        let err = crate::ops::AnyOp::parse(&ShellOp, &serde_json::json!({"cmd": "true", "out": ["x"]})).unwrap_err();
        assert_eq!(err.path, vec!["out".to_string()]);
        assert!(err.message.contains("did you mean 'outs'"), "{}", err.message);
    }
}
