//! A shared remote cache: node records by key and output objects by content
//! hash, on S3 (or an S3-compatible store) or a plain folder (a NAS, tests),
//! as Bazel's remote cache keeps an action cache beside a content store.
//!
//! Layout under the remote's prefix:
//!
//! | key | what |
//! |---|---|
//! | `objects/<h[..2]>/<h>` | a file output's bytes, or a folder output's listing (the bytes its hash is computed over: `orchestrate.dir.v1`, then `path \0 file-hash \0 size` per file), each of whose files is an object too |
//! | `records/<k[..2]>/<k>.json` | a completed node (`store::CachedNode`): which outputs, with their hashes and sizes |
//!
//! Uploads write every object of a node before its record, so a record on the
//! remote always has its objects (a killed push leaves objects without a
//! record, never the reverse), and a push skips a node whose record is already
//! there. Downloads treat the remote as hostile: a record is bounded in size,
//! must name the key it is stored under, and may only name well-formed hashes
//! and relative paths; every object is re-hashed (and its size checked against
//! the record) before it is published into the local store, and a record is
//! committed locally only after all of its objects are. Nothing from the
//! remote is executed.

mod backend;
mod sync;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::trust::{SecretKey, TrustPolicy};

pub use backend::{Backend, DirBackend, S3Backend};
pub use sync::{fetch_node, pull, push, read_record, LocalNode, Progress, RemoteRecord, Transfer};

/// A progress that draws nothing (a node fetched during a run).
pub fn sync_progress_none() -> Progress {
    Progress::new(false, "")
}

/// A remote that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Configuration or credentials: a usage error.
    #[error("{0}")]
    Config(String),
    /// The remote served something that does not check out (wrong bytes, a
    /// record that lies): refused, nothing published.
    #[error("{0}")]
    Refused(String),
    /// The transfer failed (network, permissions, disk).
    #[error("{0}")]
    Transfer(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Where a remote is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteUrl {
    S3 { bucket: String, prefix: String },
    Dir(PathBuf),
}

impl std::fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteUrl::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            RemoteUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            RemoteUrl::Dir(p) => write!(f, "file://{}", p.display()),
        }
    }
}

impl RemoteUrl {
    /// `s3://bucket[/prefix]`, `file:///absolute/path` or an absolute path.
    pub fn parse(text: &str) -> Result<RemoteUrl, RemoteError> {
        let bad = |why: &str| {
            RemoteError::Config(format!(
                "remote '{text}': {why} (expected s3://BUCKET[/PREFIX], file:///ABSOLUTE/PATH or an absolute path)"
            ))
        };
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let ok = (3..=63).contains(&bucket.len())
                && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
            if !ok {
                return Err(bad("a bucket name is 3 to 63 lowercase letters, digits, '-' and '.'"));
            }
            let prefix = prefix.trim_matches('/');
            if prefix.split('/').any(|p| p == ".." || p == ".") || prefix.contains("//") {
                return Err(bad("the prefix may not hold '.', '..' or empty segments"));
            }
            return Ok(RemoteUrl::S3 { bucket: bucket.into(), prefix: prefix.into() });
        }
        let path = text.strip_prefix("file://").unwrap_or(text);
        if text.contains("://") && !text.starts_with("file://") {
            return Err(bad("unknown scheme"));
        }
        let path = PathBuf::from(path);
        if !path.is_absolute() || path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(bad("a folder remote is an absolute path without '..'"));
        }
        Ok(RemoteUrl::Dir(path))
    }
}

/// The workspace's `config.yaml`: its remote and whom it trusts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    #[serde(default)]
    pub remote: Option<RemoteConfig>,
    /// Keys whose signature makes a remote record trusted, each `NAME:BASE64`
    /// (as `orchestrate key show NAME` prints it).
    #[serde(default)]
    pub trusted_keys: Vec<String>,
    /// Whether a record without a trusted signature is refused (default:
    /// yes once any key is trusted).
    #[serde(default)]
    pub require_signatures: Option<bool>,
    /// The key `push` signs with (a name in the user's key folder, or a
    /// PEM file's path); `--key` and `ORCHESTRATE_SIGNING_KEY` come first.
    #[serde(default)]
    pub signing_key: Option<String>,
}

impl WorkspaceConfig {
    /// Its trust policy (`trusted_keys`, `require_signatures`).
    pub fn trust(&self, workspace: &Path) -> Result<TrustPolicy, RemoteError> {
        TrustPolicy::from_config(&self.trusted_keys, self.require_signatures)
            .map_err(|e| RemoteError::Config(format!("{}: {e}", config_path(workspace).display())))
    }
}

/// The remote a workspace shares its cache through.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `s3://bucket/prefix` or `file:///path`.
    pub url: String,
    /// Parallel transfers (default 8); 0 is refused, not read as 1.
    #[serde(default)]
    pub jobs: Option<std::num::NonZeroUsize>,
}

/// The workspace config file: `WORKSPACE/config.yaml`.
pub fn config_path(workspace: &Path) -> PathBuf {
    workspace.join("config.yaml")
}

/// Reads the workspace config (absent: the default). Bounded, typed, and
/// never holding credentials (they come from the AWS variables and files).
pub fn read_config(workspace: &Path) -> Result<WorkspaceConfig, RemoteError> {
    let path = config_path(workspace);
    use crate::fsread::{read_bounded_text, BoundedFileError};
    let text = match read_bounded_text(&path, 1 << 20) {
        Ok(text) => text,
        Err(e) if e.is_absent() => return Ok(WorkspaceConfig::default()),
        Err(BoundedFileError::NotAFile { .. } | BoundedFileError::TooLarge { .. }) => {
            return Err(RemoteError::Config(format!("{}: not a regular file of at most 1 MiB", path.display())))
        }
        Err(e) => return Err(RemoteError::Config(e.to_string())),
    };
    let de = serde_yaml_ng::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de)
        .map_err(|e| RemoteError::Config(format!("{}: field {}: {}", path.display(), e.path(), e.inner())))
}

/// Which remote to use: `--remote`, else `ORCHESTRATE_REMOTE`, else the
/// workspace config's `remote.url` (`None`: no remote).
pub fn resolve(cli: Option<&str>, config: &WorkspaceConfig) -> Result<Option<(RemoteUrl, Option<usize>)>, RemoteError> {
    if let Some(url) = cli {
        return Ok(Some((RemoteUrl::parse(url)?, None)));
    }
    if let Ok(url) = std::env::var("ORCHESTRATE_REMOTE") {
        if !url.is_empty() {
            return Ok(Some((RemoteUrl::parse(&url)?, None)));
        }
    }
    match &config.remote {
        Some(r) => Ok(Some((RemoteUrl::parse(&r.url)?, r.jobs.map(std::num::NonZeroUsize::get)))),
        None => Ok(None),
    }
}

/// A connected remote.
pub struct Remote {
    pub url: RemoteUrl,
    pub backend: Box<dyn Backend>,
    /// Parallel transfers.
    pub jobs: usize,
    /// Which records are accepted from it (default: any, unverified).
    pub trust: TrustPolicy,
    /// The key records pushed to it are signed with (none: unsigned).
    pub signer: Option<SecretKey>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({})", self.url)
    }
}

impl Remote {
    /// Opens the remote: an S3 remote reads its credentials, region and
    /// endpoint from the standard AWS variables and files now, and fails
    /// here (a usage error) when there are none.
    pub fn open(url: RemoteUrl, jobs: usize) -> Result<Remote, RemoteError> {
        let backend: Box<dyn Backend> = match &url {
            RemoteUrl::Dir(p) => Box::new(DirBackend::new(p.clone())),
            RemoteUrl::S3 { bucket, prefix } => Box::new(S3Backend::from_env(bucket, prefix)?),
        };
        Ok(Remote { url, backend, jobs: jobs.max(1), trust: TrustPolicy::default(), signer: None })
    }

    /// The same remote, read under `trust`.
    pub fn with_trust(self, trust: TrustPolicy) -> Remote {
        Remote { trust, ..self }
    }

    /// The same remote, pushed to with records signed by `signer`.
    pub fn with_signer(self, signer: Option<SecretKey>) -> Remote {
        Remote { signer, ..self }
    }
}

/// A 64-hex-digit hash or key, as every name the remote gives must be.
pub(crate) fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub(crate) fn object_key(hash: &str) -> String {
    format!("objects/{}/{hash}", &hash[..2])
}

pub(crate) fn record_key(key: &str) -> String {
    format!("records/{}/{key}.json", &key[..2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_urls_parse_and_what_escapes_is_refused() {
        assert_eq!(
            RemoteUrl::parse("s3://team-cache/orchestrate/").unwrap(),
            RemoteUrl::S3 { bucket: "team-cache".into(), prefix: "orchestrate".into() }
        );
        assert_eq!(RemoteUrl::parse("file:///mnt/nas/cache").unwrap(), RemoteUrl::Dir("/mnt/nas/cache".into()));
        assert_eq!(RemoteUrl::parse("/mnt/nas").unwrap(), RemoteUrl::Dir("/mnt/nas".into()));
        for bad in ["s3://A_B/x", "s3://ab", "s3://bucket/../x", "gs://b/x", "relative/path", "file:///a/../b"] {
            assert!(RemoteUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(is_hex64(&"a".repeat(64)) && !is_hex64(&"A".repeat(64)) && !is_hex64("../x"));
    }
}
