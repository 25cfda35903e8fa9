//! Where remote bytes live: a folder, or an S3 bucket through presigned
//! requests (SigV4 by the `rusty-s3` crate, whose tests check it against
//! AWS's published examples) sent with `ureq`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusty_s3::S3Action as _;

use super::RemoteError;

/// Keys are relative, `/`-separated, made by this module (`objects/ab/ab…`).
pub trait Backend: Send + Sync {
    /// Whether the key exists (S3: a HEAD request).
    fn exists(&self, key: &str) -> Result<bool, RemoteError>;
    /// Copies the object into `out`; `None` if absent. More than `max` bytes
    /// is refused (the caller's bound: a record's declared size).
    fn get(&self, key: &str, max: u64, out: &mut dyn Write) -> Result<Option<u64>, RemoteError>;
    /// Uploads a file, reporting bytes sent as they go. Large files go in parts.
    fn put_file(&self, key: &str, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<(), RemoteError>;
    fn put_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), RemoteError>;
    /// Every key under a prefix, or `None` when that takes more than
    /// `max_pages` list requests (of up to 1,000 keys each): then asking for
    /// each key (HEAD) is cheaper.
    fn list(&self, prefix: &str, max_pages: usize) -> Result<Option<Vec<String>>, RemoteError>;
}

fn transfer(what: String) -> impl FnOnce(std::io::Error) -> RemoteError {
    move |e| RemoteError::Transfer(format!("{what}: {e}"))
}

/// Copies at most `max` bytes; one more is an error.
fn bounded_copy(from: &mut dyn Read, out: &mut dyn Write, max: u64, what: &str) -> Result<u64, RemoteError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = from.read(&mut buf).map_err(transfer(format!("reading {what}")))?;
        if k == 0 {
            return Ok(n);
        }
        n += k as u64;
        if n > max {
            return Err(RemoteError::Refused(format!("{what}: more than the {max} bytes it may have")));
        }
        out.write_all(&buf[..k]).map_err(transfer(format!("writing {what}")))?;
    }
}

/// A folder on a shared filesystem (`file:///…`). Writes go to a temporary
/// name and are renamed, so a reader sees a whole object or none, and two
/// writers of the same key both succeed. Links are never followed.
#[derive(Debug)]
pub struct DirBackend {
    root: PathBuf,
}

impl DirBackend {
    pub fn new(root: PathBuf) -> DirBackend {
        DirBackend { root }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn write(
        &self,
        key: &str,
        f: impl FnOnce(&mut std::fs::File) -> Result<(), RemoteError>,
    ) -> Result<(), RemoteError> {
        let dest = self.path(key);
        let dir = dest.parent().expect("keys have a folder");
        std::fs::create_dir_all(dir).map_err(transfer(format!("creating {}", dir.display())))?;
        let tmp = dir.join(format!(
            ".{}.{}",
            dest.file_name().unwrap_or_default().to_string_lossy(),
            crate::store::objects::unique_suffix()
        ));
        let mut file = std::fs::File::create(&tmp).map_err(transfer(format!("creating {}", tmp.display())))?;
        let written =
            f(&mut file).and_then(|()| file.sync_all().map_err(transfer(format!("syncing {}", tmp.display()))));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &dest).map_err(transfer(format!("renaming to {}", dest.display())))
    }
}

impl Backend for DirBackend {
    fn exists(&self, key: &str) -> Result<bool, RemoteError> {
        Ok(std::fs::symlink_metadata(self.path(key)).is_ok_and(|m| m.is_file()))
    }

    fn get(&self, key: &str, max: u64, out: &mut dyn Write) -> Result<Option<u64>, RemoteError> {
        let path = self.path(key);
        // The file opened is what is checked: no link followed, no FIFO waited on.
        use crate::fsread::{open_no_link, BoundedFileError};
        let mut f = match open_no_link(&path) {
            Ok(f) => f,
            Err(e) if e.is_absent() => return Ok(None),
            Err(BoundedFileError::Io { source, .. }) => {
                return Err(transfer(format!("opening {}", path.display()))(source))
            }
            Err(e) => return Err(RemoteError::Refused(e.to_string())),
        };
        bounded_copy(&mut f, out, max, &path.display().to_string()).map(Some)
    }

    fn put_file(&self, key: &str, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<(), RemoteError> {
        let mut src = std::fs::File::open(path).map_err(transfer(format!("opening {}", path.display())))?;
        self.write(key, |f| {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let k = src.read(&mut buf).map_err(transfer(format!("reading {}", path.display())))?;
                if k == 0 {
                    return Ok(());
                }
                f.write_all(&buf[..k]).map_err(transfer(format!("writing {key}")))?;
                progress(k as u64);
            }
        })
    }

    fn put_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        self.write(key, |f| f.write_all(bytes).map_err(transfer(format!("writing {key}"))))
    }

    fn list(&self, prefix: &str, _max_pages: usize) -> Result<Option<Vec<String>>, RemoteError> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.join(prefix)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for e in entries.flatten() {
                let Ok(t) = e.file_type() else { continue };
                let path = e.path();
                if t.is_dir() {
                    stack.push(path);
                } else if t.is_file() && !e.file_name().to_string_lossy().starts_with('.') {
                    if let Ok(rel) = path.strip_prefix(&self.root) {
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
            }
        }
        Ok(Some(out))
    }
}

/// AWS credentials, from the environment or a shared credentials file.
#[derive(Clone)]
struct AwsCredentials {
    key: String,
    secret: String,
    token: Option<String>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn home_file(var: &str, default: &str) -> Option<PathBuf> {
    env(var).map(PathBuf::from).or_else(|| env("HOME").map(|h| PathBuf::from(h).join(default)))
}

/// `key = value` lines of one `[section]` of an AWS INI file: the user's
/// own file, so a link to it (a dotfile manager's) is followed, as the AWS CLI
/// follows it; a FIFO or a file over 1 MiB is not read. `Ok(None)`: no such
/// file or section; `Err`: a file there that cannot be read, and why.
fn ini_section(path: &Path, section: &str) -> std::io::Result<Option<std::collections::BTreeMap<String, String>>> {
    let text = match crate::fsread::read_regular_text(path, 1 << 20) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut inside = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            if inside {
                found.get_or_insert_with(std::collections::BTreeMap::new);
            }
            continue;
        }
        if let (true, Some((k, v))) = (inside, line.split_once('=')) {
            found
                .get_or_insert_with(std::collections::BTreeMap::new)
                .insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    Ok(found)
}

fn profile() -> String {
    env("AWS_PROFILE").unwrap_or_else(|| "default".into())
}

/// Credentials: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (with
/// `AWS_SESSION_TOKEN`), else the profile (`AWS_PROFILE`, default `default`)
/// of the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, default
/// `~/.aws/credentials`).
fn credentials() -> Result<AwsCredentials, RemoteError> {
    if let (Some(key), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok(AwsCredentials { key, secret, token: env("AWS_SESSION_TOKEN") });
    }
    let profile = profile();
    let file = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    // A file there that cannot be read is said as such, not as "no credentials".
    let section = match file.as_deref() {
        Some(f) => ini_section(f, &profile).map_err(|e| {
            RemoteError::Config(format!("the shared AWS credentials file {} cannot be read: {e}", f.display()))
        })?,
        None => None,
    };
    if let Some(s) = section {
        if let (Some(key), Some(secret)) = (s.get("aws_access_key_id"), s.get("aws_secret_access_key")) {
            return Ok(AwsCredentials {
                key: key.clone(),
                secret: secret.clone(),
                token: s.get("aws_session_token").cloned(),
            });
        }
    }
    Err(RemoteError::Config(format!(
        "no AWS credentials for the S3 remote: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile \
         '{profile}' aws_access_key_id and aws_secret_access_key in {} (AWS_PROFILE picks the profile)",
        file.map_or("~/.aws/credentials".into(), |f| f.display().to_string())
    )))
}

/// The region and endpoint: `AWS_REGION` (or `AWS_DEFAULT_REGION`, else the
/// profile's `region` in `~/.aws/config`, else us-east-1), and
/// `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (else the profile's
/// `endpoint_url`, else AWS's own endpoint for the region).
fn region_and_endpoint() -> Result<(String, Option<String>), RemoteError> {
    let profile = profile();
    let section = if profile == "default" { "default".to_string() } else { format!("profile {profile}") };
    // A file there that cannot be read is said as such, never read as empty.
    let config = match home_file("AWS_CONFIG_FILE", ".aws/config") {
        Some(f) => ini_section(&f, &section)
            .map_err(|e| RemoteError::Config(format!("the AWS config file {} cannot be read: {e}", f.display())))?
            .unwrap_or_default(),
        None => Default::default(),
    };
    let region = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| config.get("region").cloned())
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint =
        env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL")).or_else(|| config.get("endpoint_url").cloned());
    Ok((region, endpoint))
}

/// How long a presigned request stays valid (a large part may take a while).
const PRESIGN: Duration = Duration::from_secs(3600);

/// Files over this size go up in parts of this size (S3 wants parts of at
/// least 5 MiB). `ORCHESTRATE_S3_PART_BYTES` changes it.
const DEFAULT_PART: u64 = 32 << 20;

/// An S3 bucket (or an S3-compatible store at `AWS_ENDPOINT_URL`).
pub struct S3Backend {
    bucket: rusty_s3::Bucket,
    prefix: String,
    credentials: AwsCredentials,
    agent: ureq::Agent,
    part: u64,
    /// `s3://bucket/prefix`, what messages name (never a signed URL).
    name: String,
    /// How long an answer's headers, or a silent body, are waited for.
    timeout: Duration,
}

/// Attempts at one request: the AWS SDKs' standard retry mode.
const ATTEMPTS: u32 = 3;

/// `<Code>` and `<Message>` of an S3 error document, if it has them.
fn s3_error(body: &str) -> (String, String) {
    let field = |tag: &str| {
        body.split(&format!("<{tag}>"))
            .nth(1)
            .and_then(|s| s.split(&format!("</{tag}>")).next())
            .map(|s| crate::ids::excerpt(s, 200))
            .unwrap_or_default()
    };
    (field("Code"), field("Message"))
}

/// What S3 answers that another attempt may not get: throttling and server errors.
fn retryable(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

impl std::fmt::Debug for S3Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Backend({})", self.name)
    }
}

impl S3Backend {
    pub fn from_env(bucket: &str, prefix: &str) -> Result<S3Backend, RemoteError> {
        let credentials = credentials()?;
        let (region, endpoint) = region_and_endpoint()?;
        // A custom endpoint (MinIO, moto, a gateway) is addressed by path; AWS by virtual host.
        let (url, style) = match &endpoint {
            Some(e) => (e.clone(), rusty_s3::UrlStyle::Path),
            None => (format!("https://s3.{region}.amazonaws.com"), rusty_s3::UrlStyle::VirtualHost),
        };
        let parsed: url::Url =
            url.parse().map_err(|e| RemoteError::Config(format!("S3 endpoint '{url}' (AWS_ENDPOINT_URL): {e}")))?;
        let bucket_handle = rusty_s3::Bucket::new(parsed, style, bucket.to_string(), region)
            .map_err(|e| RemoteError::Config(format!("S3 bucket '{bucket}' at '{url}': {e}")))?;
        let part = match env("ORCHESTRATE_S3_PART_BYTES") {
            Some(v) => v.parse::<u64>().ok().filter(|p| *p >= 5 << 20).ok_or_else(|| {
                RemoteError::Config(format!("ORCHESTRATE_S3_PART_BYTES={v}: a byte count of at least 5 MiB"))
            })?,
            None => DEFAULT_PART,
        };
        let timeout = crate::net::seconds_from_env("ORCHESTRATE_S3_TIMEOUT", Duration::from_secs(60))
            .map_err(|e| RemoteError::Config(e.to_string()))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(crate::net::connect_timeout().map_err(|e| RemoteError::Config(e.to_string()))?))
            .timeout_recv_response(Some(timeout))
            // An upload whose peer stops reading (a part is at most a few hundred MiB).
            .timeout_send_body(Some(Duration::from_secs(900)))
            .user_agent(format!("orchestrate/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let name = if prefix.is_empty() { format!("s3://{bucket}") } else { format!("s3://{bucket}/{prefix}") };
        Ok(S3Backend { bucket: bucket_handle, prefix: prefix.to_string(), credentials, agent, part, name, timeout })
    }

    fn object(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn creds(&self) -> rusty_s3::Credentials {
        let c = &self.credentials;
        match &c.token {
            Some(t) => rusty_s3::Credentials::new_with_token(c.key.clone(), c.secret.clone(), t.clone()),
            None => rusty_s3::Credentials::new(c.key.clone(), c.secret.clone()),
        }
    }

    /// Sends a presigned request. Errors name `s3://bucket/key`, never the
    /// signed URL (it carries the access key id and a signature).
    fn send(
        &self,
        method: &str,
        url: url::Url,
        key: &str,
        body: Option<&[u8]>,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let what = format!("{method} {}/{key}", self.name);
        let mut attempt = 1;
        loop {
            let request = ureq::http::Request::builder().method(method).uri(url.as_str());
            let result = match body {
                Some(b) => request.body(b.to_vec()).map(|r| self.agent.run(r)),
                None => request.body(()).map(|r| self.agent.run(r)),
            };
            let failure = match result.map_err(|e| RemoteError::Transfer(format!("{what}: {e}")))? {
                Ok(mut r) if retryable(r.status().as_u16()) => {
                    let status = r.status().as_u16();
                    let text = r.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
                    let (code, message) = s3_error(&text);
                    // A HEAD's answer has no body: the status's own words then.
                    let code = if code.is_empty() {
                        r.status().canonical_reason().unwrap_or_default().to_string()
                    } else {
                        code
                    };
                    let message = if message.is_empty() { String::new() } else { format!(": {message}") };
                    format!("{what}: HTTP {status} {code}{message}")
                }
                Ok(r) => return Ok(r),
                // Refused, reset, timed out: the network, not the request.
                Err(e) => format!("{what}: {}", strip_query(&e.to_string())),
            };
            if attempt >= ATTEMPTS {
                return Err(RemoteError::Transfer(format!("{failure} (gave up after {ATTEMPTS} attempts)")));
            }
            std::thread::sleep(crate::net::backoff(attempt, Duration::from_millis(100), Duration::from_secs(20)));
            attempt += 1;
        }
    }

    fn check(
        &self,
        method: &str,
        key: &str,
        mut r: ureq::http::Response<ureq::Body>,
    ) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let status = r.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(r);
        }
        let body = r.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
        let (code, message) = s3_error(&body);
        let hint = match status {
            401 | 403 => " (check the AWS credentials, their permissions on the bucket, and AWS_REGION)",
            404 if code == "NoSuchBucket" => " (the bucket does not exist)",
            _ => "",
        };
        let message = if message.is_empty() { String::new() } else { format!(": {message}") };
        Err(RemoteError::Transfer(format!("{method} {}/{key}: HTTP {status} {code}{message}{hint}", self.name)))
    }

    /// The XML answer of a successful request, read up to `limit` bytes (a
    /// longer one is an error, never truncated).
    fn answer(
        &self,
        method: &str,
        key: &str,
        r: ureq::http::Response<ureq::Body>,
        limit: u64,
    ) -> Result<String, RemoteError> {
        let r = self.check(method, key, r)?;
        let body = r.into_body().into_with_config().limit(limit).reader();
        let mut text = String::new();
        crate::net::StallGuard::new(body, self.timeout)
            .read_to_string(&mut text)
            .map_err(|e| RemoteError::Transfer(format!("{method} {}/{key}: {e}", self.name)))?;
        Ok(text)
    }

    fn put_single(&self, key: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        let url = self.bucket.put_object(Some(&self.creds()), &self.object(key)).sign(PRESIGN);
        let r = self.send("PUT", url, key, Some(bytes))?;
        self.check("PUT", key, r).map(drop)
    }
}

/// A URL-bearing message without query strings (signatures, credentials).
fn strip_query(text: &str) -> String {
    text.split_whitespace()
        .map(
            |w| {
                if w.contains("X-Amz-") {
                    w.split('?').next().unwrap_or("").to_string() + "?…"
                } else {
                    w.to_string()
                }
            },
        )
        .collect::<Vec<_>>()
        .join(" ")
}

impl Backend for S3Backend {
    fn exists(&self, key: &str) -> Result<bool, RemoteError> {
        let url = self.bucket.head_object(Some(&self.creds()), &self.object(key)).sign(PRESIGN);
        let r = self.send("HEAD", url, key, None)?;
        match r.status().as_u16() {
            404 => Ok(false),
            _ => self.check("HEAD", key, r).map(|_| true),
        }
    }

    fn get(&self, key: &str, max: u64, out: &mut dyn Write) -> Result<Option<u64>, RemoteError> {
        let url = self.bucket.get_object(Some(&self.creds()), &self.object(key)).sign(PRESIGN);
        let r = self.send("GET", url, key, None)?;
        if r.status().as_u16() == 404 {
            return Ok(None);
        }
        let r = self.check("GET", key, r)?;
        let what = format!("{}/{key}", self.name);
        let body = r.into_body().into_with_config().limit(max.saturating_add(1)).reader();
        let mut reader = crate::net::StallGuard::new(body, self.timeout);
        bounded_copy(&mut reader, out, max, &what).map(Some)
    }

    fn put_file(&self, key: &str, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<(), RemoteError> {
        let size = std::fs::metadata(path).map_err(transfer(format!("reading {}", path.display())))?.len();
        let mut src = std::fs::File::open(path).map_err(transfer(format!("opening {}", path.display())))?;
        if size <= self.part {
            let mut bytes = Vec::with_capacity(size as usize);
            src.read_to_end(&mut bytes).map_err(transfer(format!("reading {}", path.display())))?;
            self.put_single(key, &bytes)?;
            progress(size);
            return Ok(());
        }
        // Multipart: create, parts in order, complete (abort on failure, so
        // no half upload lingers; the object appears only at completion).
        let object = self.object(key);
        let url = self.bucket.create_multipart_upload(Some(&self.creds()), &object).sign(PRESIGN);
        let r = self.send("POST", url, key, Some(&[]))?;
        let body = self.answer("POST", key, r, 1 << 20)?;
        let created = rusty_s3::actions::CreateMultipartUpload::parse_response(&body)
            .map_err(|e| RemoteError::Transfer(format!("POST {}/{key}: unreadable answer: {e}", self.name)))?;
        let upload_id = created.upload_id().to_string();
        let parts = (|| -> Result<Vec<String>, RemoteError> {
            let mut etags = Vec::new();
            let mut buf = vec![0u8; self.part as usize];
            for number in 1u16.. {
                let mut filled = 0;
                while filled < buf.len() {
                    let k = src.read(&mut buf[filled..]).map_err(transfer(format!("reading {}", path.display())))?;
                    if k == 0 {
                        break;
                    }
                    filled += k;
                }
                if filled == 0 {
                    break;
                }
                let url = self.bucket.upload_part(Some(&self.creds()), &object, number, &upload_id).sign(PRESIGN);
                let r = self.send("PUT", url, key, Some(&buf[..filled]))?;
                let r = self.check("PUT", key, r)?;
                let etag =
                    r.headers().get("etag").and_then(|v| v.to_str().ok()).ok_or_else(|| {
                        RemoteError::Transfer(format!("PUT {}/{key} part {number}: no ETag", self.name))
                    })?;
                etags.push(etag.to_string());
                progress(filled as u64);
                if filled < buf.len() {
                    break;
                }
            }
            Ok(etags)
        })();
        let etags = match parts {
            Ok(e) => e,
            Err(e) => {
                let url = self.bucket.abort_multipart_upload(Some(&self.creds()), &object, &upload_id).sign(PRESIGN);
                let _ = self.send("DELETE", url, key, None);
                return Err(e);
            }
        };
        let creds = self.creds();
        let complete =
            self.bucket.complete_multipart_upload(Some(&creds), &object, &upload_id, etags.iter().map(String::as_str));
        let url = complete.sign(PRESIGN);
        let body = complete.body();
        let r = self.send("POST", url, key, Some(body.as_bytes()))?;
        let mut r = self.check("POST", key, r)?;
        // S3 may answer 200 with an error document.
        let answer = r.body_mut().with_config().limit(1 << 20).read_to_string().unwrap_or_default();
        if answer.contains("<Error>") {
            return Err(RemoteError::Transfer(format!(
                "completing {}/{key}: {}",
                self.name,
                answer.chars().take(300).collect::<String>()
            )));
        }
        Ok(())
    }

    fn put_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        self.put_single(key, bytes)
    }

    fn list(&self, prefix: &str, max_pages: usize) -> Result<Option<Vec<String>>, RemoteError> {
        let full = self.object(prefix);
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..max_pages.max(1) {
            let creds = self.creds();
            let mut action = self.bucket.list_objects_v2(Some(&creds));
            action.with_prefix(full.as_str());
            if let Some(t) = &token {
                action.with_continuation_token(t.as_str());
            }
            let r = self.send("GET", action.sign(PRESIGN), prefix, None)?;
            let body = self.answer("LIST", prefix, r, 16 << 20)?;
            let page = rusty_s3::actions::ListObjectsV2::parse_response(&body)
                .map_err(|e| RemoteError::Transfer(format!("LIST {}/{prefix}: unreadable answer: {e}", self.name)))?;
            out.extend(page.contents.into_iter().filter_map(|c| c.key.strip_prefix(&strip).map(str::to_string)));
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => return Ok(Some(out)),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_url_never_reaches_a_message() {
        let m = strip_query("http://127.0.0.1:9/b/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F: connection refused");
        assert!(!m.contains("AKIA") && m.contains("http://127.0.0.1:9/b/k?…"), "{m}");
    }

    #[test]
    fn credentials_come_from_the_profile_of_the_shared_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("credentials");
        std::fs::write(&f, "[default]\naws_access_key_id = A\naws_secret_access_key = B\n\n[team]\naws_access_key_id=C\naws_secret_access_key=D\naws_session_token=T\n").unwrap();
        let s = ini_section(&f, "team").unwrap().unwrap();
        assert_eq!((s["aws_access_key_id"].as_str(), s["aws_session_token"].as_str()), ("C", "T"));
        assert_eq!(ini_section(&f, "default").unwrap().unwrap()["aws_secret_access_key"], "B");
        assert!(ini_section(&f, "other").unwrap().is_none());
        assert!(ini_section(&dir.path().join("absent"), "team").unwrap().is_none());
        // A file there that cannot be read is an error, not "no such profile".
        let e = ini_section(dir.path(), "team").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
