//! The Hugging Face Hub, pinned by commit, through the cache Python's
//! `huggingface_hub` uses: a model a user already downloaded with Python is
//! reused, and what we download is reusable by `transformers`.
//!
//! The protocol is the one `huggingface_hub.file_download` speaks:
//! `HEAD {endpoint}/{repo}/resolve/{commit}/{file}` gives the commit
//! (`X-Repo-Commit`), the content hash (`X-Linked-Etag` for a large file: its
//! SHA-256; else `ETag`: its git blob id) and the size (`X-Linked-Size`, else
//! `Content-Length`); a `GET` of the resolved location gives the bytes, with
//! `Range` to resume. The cache layout is
//! `models--{owner}--{name}/{blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>}`.
//!
//! What the Hub sends is checked before use: every file is re-hashed against
//! the hash the Hub announced (a mismatch deletes the download and names the
//! file), hashes and file names must have their expected shape (they become
//! paths), sizes are bounded, and a download goes through `<etag>.incomplete`
//! so a killed one never looks complete, and resumes.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest;

/// The largest file we accept from the Hub (the 0.5B model's weights are ~1 GB).
pub const MAX_FILE_BYTES: u64 = 64 << 30;
/// Redirects followed for one request (the Hub's relative ones, then the CDN).
const MAX_REDIRECTS: usize = 5;

/// A Hub failure, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    Invalid(String),
    /// The Hub could not be reached (refused, timed out, name unknown): a
    /// cached file checked against its recorded hash may stand in.
    #[error("{0}")]
    Unreachable(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HubError {
    let context = context.into();
    move |source| HubError::Io { context, source }
}

type Result<T> = std::result::Result<T, HubError>;

/// Where and how to reach the Hub, from the same variables `huggingface_hub` reads.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, else `https://huggingface.co`.
    pub endpoint: String,
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache: PathBuf,
    /// `HF_TOKEN`, else the token file `hf auth login` writes (`HF_TOKEN_PATH`,
    /// else `$HF_HOME/token`). Never logged.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE=1`: only the cache.
    pub offline: bool,
    /// `HF_HUB_DOWNLOAD_TIMEOUT` (seconds, default 10, as `huggingface_hub`):
    /// the longest wait for an answer's headers, and for a body that has gone
    /// silent (or trickles under 1 KiB in that time). See [`crate::net`].
    pub timeout: Duration,
    /// `ORCHESTRATE_CONNECT_TIMEOUT` (default 10 s).
    pub connect_timeout: Duration,
}

/// Attempts at one download, each resuming from what the previous one wrote
/// (`huggingface_hub` retries 5 times too).
const ATTEMPTS: u32 = 5;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn truthy(v: &str) -> bool {
    // huggingface_hub's `_is_true`.
    matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
}

impl HubConfig {
    pub fn from_env() -> Result<HubConfig> {
        let home = || std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        let hf_home = env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            env("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache")).join("huggingface")
        });
        let cache = env("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| hf_home.join("hub"));
        let token = env("HF_TOKEN").or_else(|| {
            let path = env("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
            // A regular file of a token's size (a FIFO is refused, not waited on).
            crate::fsread::read_regular_text(&path, 64 << 10)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        Ok(HubConfig {
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .into(),
            cache,
            token,
            offline: env("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)),
            timeout: crate::net::seconds_from_env("HF_HUB_DOWNLOAD_TIMEOUT", Duration::from_secs(10))
                .map_err(|e| HubError::Invalid(e.to_string()))?,
            connect_timeout: crate::net::connect_timeout().map_err(|e| HubError::Invalid(e.to_string()))?,
        })
    }
}

/// Checks a repo id: `owner/name`, each part of letters, digits, `-`, `_`, `.`
/// (not starting or ending with `-` or `.`, no `..`), at most 96 characters.
pub fn check_repo(repo: &str) -> std::result::Result<(), HubError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("..")
    };
    match repo.split_once('/') {
        Some((owner, name)) if part_ok(owner) && part_ok(name) => Ok(()),
        _ => Err(HubError::Invalid(format!(
            "'{repo}' is not a Hub repo id (expected owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct or openai/gsm8k)"
        ))),
    }
}

/// Checks that a revision is a full commit id: a branch or a tag moves, so it
/// cannot key a cache.
pub fn check_commit(repo: &str, revision: &str) -> std::result::Result<(), HubError> {
    if revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return Ok(());
    }
    Err(HubError::Invalid(format!(
        "revision '{revision}' is not a commit: a branch or tag can move, so it cannot pin a repo. Use the full 40-character \
         commit id, e.g. from `git ls-remote https://huggingface.co/{repo} {revision}`, the repo's \"Files and versions\" \
         history on the Hub, or `huggingface_hub.HfApi().model_info('{repo}', revision='{revision}').sha`"
    )))
}

/// A file name inside a repo: plain names and sub-folders, never a way out.
fn check_file_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('/')
        && name.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && !name.contains('\\')
        && !name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(format!("'{name}' is not a file name inside a repo"))
    }
}

/// What the Hub announced for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    pub commit: String,
    /// The content hash: 64 hex (SHA-256, a large file) or 40 hex (git blob id).
    pub etag: String,
    /// Which of the two `etag` is.
    pub kind: HashKind,
    pub size: u64,
    /// Where the bytes are (the CDN for a large file).
    pub location: String,
}

/// A file fetched (or found) for a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub name: String,
    pub path: PathBuf,
    pub etag: String,
    pub size: u64,
    /// `cache` (already there) or `downloaded`.
    pub source: &'static str,
}

/// What a repo holds: the Hub serves and caches the two apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoKind {
    /// `{endpoint}/{repo}/…`, cached as `models--owner--name`.
    Model,
    /// `{endpoint}/datasets/{repo}/…`, cached as `datasets--owner--name`.
    Dataset,
}

impl RepoKind {
    /// The URL path segment before the repo id (`datasets/`), empty for models.
    fn url_prefix(self) -> &'static str {
        match self {
            RepoKind::Model => "",
            RepoKind::Dataset => "datasets/",
        }
    }
    /// The API's plural (`/api/models/…`, `/api/datasets/…`).
    fn api(self) -> &'static str {
        match self {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        }
    }
}

/// One entry of the Hub's tree listing (`/api/{models,datasets}/{repo}/tree/{commit}/{path}`).
#[derive(Debug, Clone, serde::Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
}

/// The largest tree listing read (8 MiB: tens of thousands of entries).
const MAX_LISTING_BYTES: u64 = 8 << 20;

/// As a node's log records it: `downloaded config.json: 663 bytes, hash … (path)`.
impl std::fmt::Display for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {} bytes, hash {} ({})", self.source, self.name, self.size, self.etag, self.path.display())
    }
}

/// One repo at one commit, in the cache.
pub struct Snapshot<'a> {
    pub config: &'a HubConfig,
    pub kind: RepoKind,
    pub repo: String,
    pub commit: String,
    agent: ureq::Agent,
    /// Progress on a terminal (hidden otherwise).
    pub progress: bool,
    /// Set once the Hub could not be reached: the other files go straight to
    /// the cache's recorded hashes instead of each waiting out a timeout.
    unreachable: std::cell::Cell<bool>,
}

/// How the Hub names a file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKind {
    /// SHA-256 of the bytes (a large, LFS or Xet, file: `X-Linked-Etag`).
    Sha256,
    /// Git's blob id, `sha1("blob {len}\0" + bytes)` (a small file: `ETag`).
    GitBlob,
}

impl HashKind {
    /// The kind a content hash has by its shape (lowercase hex of 64 or 40
    /// digits), or `None`: it also becomes a file name, so nothing else passes.
    pub fn of(etag: &str) -> Option<HashKind> {
        let hex = etag.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        match etag.len() {
            64 if hex => Some(HashKind::Sha256),
            40 if hex => Some(HashKind::GitBlob),
            _ => None,
        }
    }
}

impl std::fmt::Display for HashKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HashKind::Sha256 => "sha256",
            HashKind::GitBlob => "git blob id",
        })
    }
}

/// The hash of a file as the Hub names it.
pub fn content_hash(path: &Path, kind: HashKind) -> Result<String> {
    let mut f = File::open(path).map_err(io(format!("reading {}", path.display())))?;
    match kind {
        HashKind::Sha256 => digest_of(&mut f, path, sha2::Sha256::new()),
        HashKind::GitBlob => {
            let len = f.metadata().map_err(io(format!("reading {}", path.display())))?.len();
            let mut d = sha1::Sha1::new();
            d.update(format!("blob {len}\0").as_bytes());
            digest_of(&mut f, path, d)
        }
    }
}

/// Streams the rest of `f` into `d`, as lowercase hex.
fn digest_of<D: Digest>(f: &mut File, path: &Path, mut d: D) -> Result<String> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        d.update(&buf[..n]);
    }
    Ok(d.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `models--owner--name` (or `datasets--…`): a repo's folder in the cache and in its `.locks`.
fn repo_folder(kind: RepoKind, repo: &str) -> String {
    format!("{}--{}", kind.api(), repo.replace('/', "--"))
}

impl<'a> Snapshot<'a> {
    /// A model repo at a commit; both are checked here.
    pub fn new(config: &'a HubConfig, repo: &str, commit: &str) -> Result<Snapshot<'a>> {
        Self::of_kind(config, RepoKind::Model, repo, commit)
    }

    /// A repo of a kind at a commit; both are checked here.
    pub fn of_kind(config: &'a HubConfig, kind: RepoKind, repo: &str, commit: &str) -> Result<Snapshot<'a>> {
        check_repo(repo)?;
        check_commit(repo, commit)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(config.connect_timeout))
            .timeout_recv_response(Some(config.timeout))
            .user_agent(format!("orchestrate/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Snapshot {
            config,
            kind,
            repo: repo.into(),
            commit: commit.into(),
            agent,
            progress: false,
            unreachable: std::cell::Cell::new(false),
        })
    }

    /// `models--owner--name` in the cache.
    pub fn repo_dir(&self) -> PathBuf {
        self.config.cache.join(repo_folder(self.kind, &self.repo))
    }

    /// `snapshots/<commit>`: the folder transformers loads.
    pub fn dir(&self) -> PathBuf {
        self.repo_dir().join("snapshots").join(&self.commit)
    }

    fn url(&self, file: &str) -> String {
        format!("{}/{}{}/resolve/{}/{}", self.config.endpoint, self.kind.url_prefix(), self.repo, self.commit, file)
    }

    /// Checks that the folders from the repo's to `folder` of the snapshot
    /// (`""` for its top) are real folders (or absent): a `snapshots/<commit>`
    /// that is a link to a folder elsewhere is refused, never read from or
    /// written into. `what` names what was wanted from it, in the error.
    fn check_layout(&self, folder: &str, what: &str) -> Result<()> {
        let mut dir = self.repo_dir();
        let mut parts = vec!["snapshots".to_string(), self.commit.clone()];
        parts.extend(folder.split('/').filter(|p| !p.is_empty()).map(str::to_string));
        for part in std::iter::once(None).chain(parts.iter().map(Some)) {
            if let Some(part) = part {
                dir.push(part);
            }
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(HubError::Invalid(format!(
                        "{} in the Hugging Face cache is a link or a file, not a folder: refusing to read from or \
                         write through it. Remove it and run again to fetch {what} of {} afresh",
                        dir.display(),
                        self.repo
                    )))
                }
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }

    /// Where the hash the Hub announced for a file at this commit is recorded
    /// when we fetch it (a flat name: files can be in sub-folders).
    fn record_path(&self, file: &str) -> PathBuf {
        self.repo_dir()
            .join(".orchestrate-etags")
            .join(&self.commit)
            .join(blake3::hash(file.as_bytes()).to_hex().as_str())
    }

    fn recorded(&self, file: &str) -> Option<String> {
        let path = self.record_path(file);
        let text = crate::fsread::read_bounded_text(&path, 256).ok()?;
        let etag = text.split_whitespace().next()?.to_string();
        HashKind::of(&etag).map(|_| etag)
    }

    /// Makes (or checks) every folder from the cache root down to `dir` as a
    /// real folder, never following a link; the cache root itself may be one.
    fn own_folders(&self, dir: &Path) -> Result<()> {
        let root = &self.config.cache;
        fs::create_dir_all(root).map_err(io(format!("creating {}", root.display())))?;
        let mut at = root.clone();
        for part in dir.strip_prefix(root).unwrap_or(Path::new("")).components() {
            at.push(part);
            crate::store::fsx::own_dir(&at).map_err(|e| HubError::Invalid(e.to_string()))?;
        }
        Ok(())
    }

    fn record(&self, file: &str, etag: &str) -> Result<()> {
        let path = self.record_path(file);
        let dir = path.parent().expect("a record has a folder");
        self.own_folders(dir)?;
        crate::store::write_atomic(&path, format!("{etag}\n").as_bytes())
            .map_err(io(format!("writing {}", path.display())))
    }

    /// The bytes a pointer stands for: the blob a layout link resolves to
    /// (inside this repo's blobs, or an error), or a plain file as it is.
    /// `None` when there is no pointer.
    fn pointed(&self, file: &str) -> Result<Option<(PathBuf, Option<String>)>> {
        let pointer = self.dir().join(file);
        let Ok(meta) = fs::symlink_metadata(&pointer) else { return Ok(None) };
        if meta.file_type().is_symlink() {
            let blobs = self.repo_dir().join("blobs");
            let target = fs::canonicalize(&pointer).map_err(io(format!("resolving {}", pointer.display())))?;
            let blobs = fs::canonicalize(&blobs).map_err(io(format!("resolving {}", blobs.display())))?;
            if target.parent() != Some(blobs.as_path()) || !target.is_file() {
                return Err(HubError::Invalid(format!(
                    "{}: points to {}, which is not a file of the repo's blobs folder {}",
                    pointer.display(),
                    target.display(),
                    blobs.display()
                )));
            }
            let name = target.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            return Ok(Some((target, Some(name))));
        }
        if meta.is_file() {
            return Ok(Some((pointer, None)));
        }
        Err(HubError::Invalid(format!("{} is neither a file nor a link to a blob", pointer.display())))
    }

    /// The cached file checked against the Hub's announcement, whatever its
    /// form in the cache; `None` when absent or not those bytes (it is
    /// fetched again and the pointer replaced).
    fn cached_announced(&self, file: &str, meta: &FileMeta) -> Result<Option<Fetched>> {
        let Some((bytes_at, _)) = self.pointed(file)? else { return Ok(None) };
        if content_hash(&bytes_at, meta.kind)? != meta.etag {
            return Ok(None);
        }
        let size = fs::metadata(&bytes_at).map_err(io(format!("reading {}", bytes_at.display())))?.len();
        Ok(Some(Fetched {
            name: file.into(),
            path: self.dir().join(file),
            etag: meta.etag.clone(),
            size,
            source: "cache",
        }))
    }

    /// The cached file without the Hub (offline, or unreachable): a layout
    /// link whose blob is named by its hash, re-hashed, and the same hash we
    /// recorded when we fetched it (so a pointer to another file's blob is
    /// refused); a plain file only when a recorded hash checks it.
    fn cached_recorded(&self, file: &str) -> Result<Option<Fetched>> {
        let Some((bytes_at, named)) = self.pointed(file)? else { return Ok(None) };
        let recorded = self.recorded(file);
        let etag = match (&named, &recorded) {
            (Some(name), Some(rec)) if name != rec => {
                return Err(HubError::Invalid(format!(
                    "{file} of {} at {} in the cache points at blob {name}, but the Hub announced {rec} for it when it \
                     was fetched: the cache was altered. Delete {} and run with network",
                    self.repo,
                    self.commit,
                    self.dir().join(file).display()
                )))
            }
            (Some(name), _) => name.clone(),
            (None, Some(rec)) => rec.clone(),
            (None, None) => {
                return Err(HubError::Invalid(format!(
                    "{} is a plain file, not a link to a blob named by its hash, and no hash was recorded for it: it \
                     cannot be checked without the Hub. Run once with network (it is then checked against the Hub's \
                     hash), or delete it",
                    self.dir().join(file).display()
                )))
            }
        };
        let Some(kind) = HashKind::of(&etag) else {
            return Err(HubError::Invalid(format!("{}: blob name '{etag}' is not a content hash", bytes_at.display())));
        };
        let got = content_hash(&bytes_at, kind)?;
        if got != etag {
            return Err(HubError::Invalid(format!(
                "{file} of {} at {} in the cache ({}) is damaged: its {kind} is {got}, but it should be {etag}. Delete it \
                 and run again to download it",
                self.repo,
                self.commit,
                bytes_at.display()
            )));
        }
        let size = fs::metadata(&bytes_at).map_err(io(format!("reading {}", bytes_at.display())))?.len();
        Ok(Some(Fetched { name: file.into(), path: self.dir().join(file), etag, size, source: "cache" }))
    }

    /// A request with the token, which never leaves the endpoint's host.
    fn request(&self, method: &str, url: &str, range_from: Option<u64>) -> Result<ureq::http::Response<ureq::Body>> {
        let same_host = host_of(url) == host_of(&self.config.endpoint);
        let mut builder = ureq::http::Request::builder().method(method).uri(url).header("Accept-Encoding", "identity");
        if let (Some(t), true) = (&self.config.token, same_host) {
            builder = builder.header("Authorization", format!("Bearer {t}"));
        }
        if let Some(from) = range_from {
            builder = builder.header("Range", format!("bytes={from}-"));
        }
        let request = builder.body(()).map_err(|e| HubError::Invalid(format!("{url}: {e}")))?;
        self.agent.run(request).map_err(|e| {
            HubError::Unreachable(format!(
                "{method} {url}: {e} (the Hub endpoint is {}; set HF_ENDPOINT for a mirror, or HF_HUB_OFFLINE=1 to use \
                 only the cache)",
                self.config.endpoint
            ))
        })
    }

    /// The files under `folder` at this commit (repo paths, sorted, not
    /// recursive into sub-folders): the Hub's tree listing, or, offline or
    /// when the Hub cannot be reached, the files of the cached snapshot's folder.
    pub fn list(&self, folder: &str) -> Result<Vec<String>> {
        check_file_name(folder).map_err(HubError::Invalid)?;
        if !(self.config.offline || self.unreachable.get()) {
            match self.list_remote(folder) {
                Err(HubError::Unreachable(why)) => {
                    self.unreachable.set(true);
                    return self.list_cached(folder).map_err(|e| HubError::Invalid(format!("{why}; and {e}")));
                }
                other => return other,
            }
        }
        self.list_cached(folder)
    }

    fn list_remote(&self, folder: &str) -> Result<Vec<String>> {
        let url =
            format!("{}/api/{}/{}/tree/{}/{}", self.config.endpoint, self.kind.api(), self.repo, self.commit, folder);
        let resp = self.request("GET", &url, None)?;
        let status = resp.status().as_u16();
        match status {
            200 => {}
            401 | 403 => return Err(HubError::Invalid(self.refused("GET", status, &url))),
            404 => return Ok(Vec::new()),
            _ => return Err(HubError::Invalid(format!("GET {url}: HTTP {status}"))),
        }
        if resp.headers().get("link").and_then(|v| v.to_str().ok()).is_some_and(|l| l.contains("rel=\"next\"")) {
            return Err(HubError::Invalid(format!(
                "GET {url}: the listing has more than one page; name the files instead (params.files)"
            )));
        }
        let mut body = Vec::new();
        let stream = resp.into_body().into_with_config().limit(MAX_LISTING_BYTES + 1).reader();
        let mut reader = crate::net::StallGuard::new(stream, self.config.timeout);
        (&mut reader)
            .take(MAX_LISTING_BYTES + 1)
            .read_to_end(&mut body)
            .map_err(|e| HubError::Unreachable(format!("GET {url}: {e}")))?;
        if body.len() as u64 > MAX_LISTING_BYTES {
            return Err(HubError::Invalid(format!("GET {url}: the listing is over {MAX_LISTING_BYTES} bytes")));
        }
        let entries: Vec<TreeEntry> = serde_json::from_slice(&body)
            .map_err(|e| HubError::Invalid(format!("GET {url}: not a Hub tree listing: {e}")))?;
        let prefix = format!("{}/", folder.trim_end_matches('/'));
        let mut files = Vec::new();
        for e in entries {
            if e.kind != "file" {
                continue;
            }
            check_file_name(&e.path).map_err(|m| HubError::Invalid(format!("GET {url}: {m}")))?;
            if !e.path.starts_with(&prefix) || e.path[prefix.len()..].contains('/') {
                return Err(HubError::Invalid(format!("GET {url}: '{}' is not a file of {folder}/", e.path)));
            }
            files.push(e.path);
        }
        files.sort();
        Ok(files)
    }

    fn list_cached(&self, folder: &str) -> Result<Vec<String>> {
        self.check_layout(folder, &format!("the files of {folder}/"))?;
        let dir = self.dir().join(folder);
        let entries = fs::read_dir(&dir).map_err(|e| {
            HubError::Invalid(format!(
                "{folder} of {} at {} is not in the cache ({}: {e}); run once with the Hub reachable (HF_HUB_OFFLINE unset)",
                self.repo,
                self.commit,
                dir.display()
            ))
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(format!("listing {}", dir.display())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Snapshot files are links into blobs/; sub-folders are skipped.
            if fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
                files.push(format!("{}/{name}", folder.trim_end_matches('/')));
            }
        }
        files.sort();
        Ok(files)
    }

    /// What the Hub says about a file: `None` if the file is not in the repo at
    /// this commit (404).
    pub fn metadata(&self, file: &str) -> Result<Option<FileMeta>> {
        check_file_name(file).map_err(HubError::Invalid)?;
        let mut url = self.url(file);
        for _ in 0..=MAX_REDIRECTS {
            let resp = self.request("HEAD", &url, None)?;
            let status = resp.status().as_u16();
            let header = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
            let location = header("location");
            match status {
                401 | 403 => return Err(HubError::Invalid(self.refused("HEAD", status, &url))),
                404 => return Ok(None),
                // The Hub's own relative redirects (a renamed repo) are followed
                // for the metadata; a redirect to the CDN carries it already.
                300..=399
                    if location.as_deref().is_some_and(|l| l.starts_with('/')) && header("x-linked-etag").is_none() =>
                {
                    url = resolve(&url, location.as_deref().unwrap_or_default());
                    continue;
                }
                200..=399 => {}
                _ => return Err(HubError::Invalid(format!("HEAD {url}: HTTP {status}"))),
            }
            let commit = header("x-repo-commit").ok_or_else(|| {
                HubError::Invalid(format!("HEAD {url}: no X-Repo-Commit header (is {} a Hub?)", self.config.endpoint))
            })?;
            if commit != self.commit {
                return Err(HubError::Invalid(format!(
                    "HEAD {url}: the Hub resolved {file} at commit {commit}, not the pinned {}",
                    self.commit
                )));
            }
            let etag = header("x-linked-etag").or_else(|| header("etag")).unwrap_or_default();
            let etag = etag.trim_start_matches("W/").trim_matches('"').to_string();
            let Some(kind) = HashKind::of(&etag) else {
                return Err(HubError::Invalid(format!(
                    "HEAD {url}: ETag '{etag}' is neither a SHA-256 nor a git blob id; nothing to check {file} against"
                )));
            };
            let size = if (300..400).contains(&status) {
                header("x-linked-size")
            } else {
                header("x-linked-size").or_else(|| header("content-length"))
            };
            let size: u64 = size.and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
                HubError::Invalid(format!("HEAD {url}: no size (X-Linked-Size or Content-Length) for {file}"))
            })?;
            if size > MAX_FILE_BYTES {
                return Err(HubError::Invalid(format!(
                    "HEAD {url}: {file} is {size} bytes, over the limit of {MAX_FILE_BYTES}"
                )));
            }
            let location = location.map_or(url.clone(), |l| resolve(&url, &l));
            return Ok(Some(FileMeta { commit, etag, kind, size, location }));
        }
        Err(HubError::Invalid(format!("HEAD {}: more than {MAX_REDIRECTS} redirects", self.url(file))))
    }

    fn refused(&self, method: &str, status: u16, url: &str) -> String {
        let token = if self.config.token.is_some() {
            "the token in HF_TOKEN (or the token file) was refused: check it has read access"
        } else {
            "no token was sent: set HF_TOKEN to a token with read access (https://huggingface.co/settings/tokens)"
        };
        format!(
            "{method} {url}: HTTP {status}: {} is private, gated or does not exist; {token}, and for a gated model accept its \
             terms on its Hub page",
            self.repo
        )
    }

    /// The file, from the cache or the Hub; `None` when it is not in the repo.
    ///
    /// Online, the Hub's announced hash decides: a cached copy is used only
    /// when its bytes have that hash, and huggingface_hub's `.no_exists`
    /// marker is not trusted. Offline (`HF_HUB_OFFLINE=1`), or when the Hub
    /// cannot be reached, the cache stands in, checked against the hashes it
    /// records ([`Snapshot::cached_recorded`]), and `.no_exists` is a hint.
    pub fn fetch(&self, file: &str) -> Result<Option<Fetched>> {
        check_file_name(file).map_err(HubError::Invalid)?;
        self.check_layout(crate::store::fsx::parent_rel(file), file)?;
        let meta = if self.config.offline || self.unreachable.get() {
            None
        } else {
            match self.metadata(file) {
                Ok(Some(meta)) => Some(meta),
                Ok(None) => {
                    self.remember_absent(file)?;
                    return Ok(None);
                }
                Err(HubError::Unreachable(why)) => {
                    self.unreachable.set(true);
                    return match self.cached_recorded(file)? {
                        Some(f) => Ok(Some(f)),
                        None => Err(HubError::Unreachable(why)),
                    };
                }
                Err(e) => return Err(e),
            }
        };
        let Some(meta) = meta else {
            if let Some(f) = self.cached_recorded(file)? {
                return Ok(Some(f));
            }
            // huggingface_hub's marker of a file the Hub said is not there (404).
            let absent = self.repo_dir().join(".no_exists").join(&self.commit).join(file);
            if fs::symlink_metadata(&absent).is_ok_and(|m| m.is_file()) {
                return Ok(None);
            }
            return Err(HubError::Invalid(format!(
                "HF_HUB_OFFLINE is set and {file} of {} at {} is not in the Hugging Face cache (no {}): run once with \
                 network, or `hf download {} --revision {}` (Python's huggingface_hub) into the same cache",
                self.repo,
                self.commit,
                self.dir().join(file).display(),
                self.repo,
                self.commit
            )));
        };
        if let Some(f) = self.cached_announced(file, &meta)? {
            self.record(file, &meta.etag)?;
            return Ok(Some(f));
        }
        let blobs = self.repo_dir().join("blobs");
        self.own_folders(&blobs)?;
        let blob = blobs.join(&meta.etag);
        // One download of a blob at a time, here and in Python (filelock uses flock
        // on the same file).
        let locks = self.config.cache.join(".locks").join(repo_folder(self.kind, &self.repo));
        self.own_folders(&locks)?;
        let lock_path = locks.join(format!("{}.lock", meta.etag));
        let lock = crate::store::fsx::open_lock(&lock_path).map_err(io(format!("opening {}", lock_path.display())))?;
        lock.lock().map_err(io(format!("locking {}", lock_path.display())))?;
        let mut source = "cache";
        let blob_ok =
            fs::symlink_metadata(&blob).is_ok_and(|m| m.is_file()) && content_hash(&blob, meta.kind)? == meta.etag;
        if !blob_ok {
            self.download(file, &meta, &blob)?;
            source = "downloaded";
        }
        let pointer = self.dir().join(file);
        let parent = pointer.parent().expect("a pointer has a folder");
        self.own_folders(parent)?;
        // Relative, as huggingface_hub writes it: the cache can move.
        // From snapshots/<commit>/[sub/]: up to the repo folder, then blobs/.
        let target = PathBuf::from("../".repeat(file.matches('/').count() + 2)).join("blobs").join(&meta.etag);
        let tmp =
            parent.join(format!(".{}.orchestrate-link", pointer.file_name().unwrap_or_default().to_string_lossy()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).map_err(io(format!("linking {}", tmp.display())))?;
        // A rename replaces whatever was there (a plain file, another link) itself, never through it.
        fs::rename(&tmp, &pointer).map_err(io(format!("linking {}", pointer.display())))?;
        self.record(file, &meta.etag)?;
        Ok(Some(Fetched { name: file.into(), path: pointer, etag: meta.etag, size: meta.size, source }))
    }

    /// Remembers, as Python does, that the Hub has no such file at this commit.
    fn remember_absent(&self, file: &str) -> Result<()> {
        let absent = self.repo_dir().join(".no_exists").join(&self.commit).join(file);
        self.own_folders(absent.parent().expect("a marker has a folder"))?;
        crate::store::fsx::open_truncate(&absent).map(drop).map_err(io(format!("writing {}", absent.display())))
    }

    /// Downloads into `<blob>.incomplete` (resuming what is there), checks the
    /// hash, then renames: a killed download never looks complete. A failure
    /// the network may not repeat (a reset, a stall, an unreachable host, an
    /// HTTP 5xx or 429) is tried again, up to [`ATTEMPTS`] in all, with capped
    /// exponential backoff and jitter, each attempt resuming with `Range`.
    fn download(&self, file: &str, meta: &FileMeta, blob: &Path) -> Result<()> {
        let mut attempt = 1;
        loop {
            match self.download_once(file, meta, blob) {
                Ok(()) => return Ok(()),
                Err(Attempt::Retry(e)) if attempt < ATTEMPTS => {
                    let wait = crate::net::backoff(attempt, Duration::from_millis(250), Duration::from_secs(8));
                    eprintln!("{e}; attempt {} of {ATTEMPTS} in {:.1} s", attempt + 1, wait.as_secs_f64());
                    std::thread::sleep(wait);
                    attempt += 1;
                }
                Err(Attempt::Retry(e)) => {
                    return Err(HubError::Invalid(format!("{e} (gave up after {ATTEMPTS} attempts)")));
                }
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
    }

    fn download_once(&self, file: &str, meta: &FileMeta, blob: &Path) -> std::result::Result<(), Attempt> {
        use std::os::unix::fs::OpenOptionsExt;
        let partial = blob.with_file_name(format!("{}.incomplete", meta.etag));
        // Never written through a link: one planted there is removed (as a link).
        if fs::symlink_metadata(&partial).is_ok_and(|m| !m.is_file()) {
            fs::remove_file(&partial).map_err(io(format!("removing {}", partial.display())))?;
        }
        let have = fs::symlink_metadata(&partial).map(|m| m.len()).unwrap_or(0);
        let have = if have > meta.size { 0 } else { have };
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&partial)
            .map_err(io(format!("opening {}", partial.display())))?;
        let mut written = have;
        if have < meta.size {
            let mut url = meta.location.clone();
            let mut resp = None;
            for _ in 0..=MAX_REDIRECTS {
                let r = self.request("GET", &url, (have > 0).then_some(have)).map_err(Attempt::of)?;
                let status = r.status().as_u16();
                if (300..400).contains(&status) {
                    let l = r.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                    url = resolve(&url, &l);
                    continue;
                }
                resp = Some((status, r, url.clone()));
                break;
            }
            let Some((status, r, url)) = resp else {
                return Err(
                    HubError::Invalid(format!("GET {}: more than {MAX_REDIRECTS} redirects", meta.location)).into()
                );
            };
            match status {
                // The server honoured the range: append.
                206 if have > 0 => {
                    let range = r.headers().get("content-range").and_then(|v| v.to_str().ok()).unwrap_or_default();
                    if !range.starts_with(&format!("bytes {have}-")) {
                        return Err(HubError::Invalid(format!(
                            "GET {url}: asked for bytes {have}- of {file}, got Content-Range '{range}'"
                        ))
                        .into());
                    }
                }
                // A whole body (no range asked, or the range ignored): start over.
                200 => written = 0,
                401 | 403 => return Err(HubError::Invalid(self.refused("GET", status, &url)).into()),
                429 | 500..=599 => {
                    return Err(Attempt::Retry(HubError::Invalid(format!("GET {url}: HTTP {status} for {file}"))))
                }
                _ => return Err(HubError::Invalid(format!("GET {url}: HTTP {status} for {file}")).into()),
            }
            out.set_len(written).map_err(io(format!("truncating {}", partial.display())))?;
            out.seek(std::io::SeekFrom::Start(written)).map_err(io(format!("seeking {}", partial.display())))?;
            let bar = if self.progress {
                let bar = indicatif::ProgressBar::new(meta.size);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_bar}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar.set_message(file.to_string());
                bar.set_position(written);
                bar
            } else {
                indicatif::ProgressBar::hidden()
            };
            // Never more than announced: a body that runs past the size is refused.
            let body = r.into_body().into_with_config().limit(meta.size - written + 1).reader();
            let mut body = crate::net::StallGuard::new(body, self.config.timeout);
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match body.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = out.sync_all();
                        return Err(Attempt::Retry(HubError::Invalid(format!(
                            "GET {url}: {file}: the download stopped after {written} of {} bytes ({e})",
                            meta.size
                        ))));
                    }
                };
                if n == 0 {
                    break;
                }
                written += n as u64;
                if written > meta.size {
                    drop(out);
                    let _ = fs::remove_file(&partial);
                    return Err(HubError::Invalid(format!(
                        "GET {url}: {file} is longer than the {} bytes the Hub announced; the download was deleted",
                        meta.size
                    ))
                    .into());
                }
                out.write_all(&buf[..n]).map_err(io(format!("writing {}", partial.display())))?;
                bar.set_position(written);
            }
            bar.finish_and_clear();
            out.sync_all().map_err(io(format!("writing {}", partial.display())))?;
        }
        drop(out);
        if written != meta.size {
            return Err(Attempt::Retry(HubError::Invalid(format!(
                "{file}: the download ended after {written} of {} bytes",
                meta.size
            ))));
        }
        let kind = meta.kind;
        let got = content_hash(&partial, kind)?;
        if got != meta.etag {
            let _ = fs::remove_file(&partial);
            return Err(HubError::Invalid(format!(
                "{file} of {} at {}: the downloaded bytes have {kind} {got}, but the Hub announced {}; the download was \
                 deleted",
                self.repo, self.commit, meta.etag
            ))
            .into());
        }
        fs::rename(&partial, blob).map_err(io(format!("publishing {}", blob.display())))?;
        Ok(())
    }
}

/// How one download attempt failed: worth another attempt, or not.
enum Attempt {
    Retry(HubError),
    Fatal(HubError),
}

impl Attempt {
    fn of(e: HubError) -> Attempt {
        match e {
            HubError::Unreachable(_) => Attempt::Retry(e),
            e => Attempt::Fatal(e),
        }
    }
}

impl From<HubError> for Attempt {
    fn from(e: HubError) -> Attempt {
        Attempt::Fatal(e)
    }
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or_default()
}

/// A `Location` against the URL it answered.
fn resolve(base: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    let host = rest.split('/').next().unwrap_or_default();
    if location.starts_with('/') {
        format!("{scheme}://{host}{location}")
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
        format!("{dir}/{location}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_or_tag_is_refused_with_how_to_find_the_commit() {
        for rev in ["main", "v1.0", "7ae5576", "7AE557604ADF67BE50417F59C2C2F167DEF9A775"] {
            let e = check_commit("Qwen/Qwen2.5-0.5B-Instruct", rev).unwrap_err().to_string();
            assert!(e.contains(&format!("'{rev}' is not a commit")) && e.contains("git ls-remote"), "{e}");
        }
        check_commit("Qwen/Qwen2.5-0.5B-Instruct", "7ae557604adf67be50417f59c2c2f167def9a775").unwrap();
    }

    #[test]
    fn repo_ids_and_file_names_cannot_leave_the_cache() {
        check_repo("Qwen/Qwen2.5-0.5B-Instruct").unwrap();
        for bad in ["Qwen", "../x", "a/..", "a/b/c", "a/.b", "/a", "a/b c", "a/"] {
            assert!(check_repo(bad).is_err(), "{bad}");
        }
        check_file_name("config.json").unwrap();
        check_file_name("onnx/model.onnx").unwrap();
        for bad in ["../x", "a/../../x", "/etc/passwd", "", "a//b", "a\\b", "./a"] {
            assert!(check_file_name(bad).is_err(), "{bad}");
        }
        assert_eq!(HashKind::of("../../x"), None);
        assert_eq!(HashKind::of(&"a".repeat(64)), Some(HashKind::Sha256));
    }

    #[test]
    fn the_git_blob_id_is_gits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "hello\n").unwrap();
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(content_hash(&p, HashKind::GitBlob).unwrap(), "ce013625030ba8dba906f756967f9e9ca394464a");
        // `printf 'hello\n' | sha256sum`
        assert_eq!(
            content_hash(&p, HashKind::Sha256).unwrap(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
    }

    #[test]
    fn locations_resolve_against_their_request() {
        assert_eq!(resolve("http://h:1/a/resolve/c/f", "/b/resolve/c/f"), "http://h:1/b/resolve/c/f");
        assert_eq!(resolve("http://h:1/a/b", "https://cdn/x"), "https://cdn/x");
        assert_eq!(host_of("http://127.0.0.1:9/x"), "127.0.0.1:9");
    }
}
