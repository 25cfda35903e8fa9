//! `model.hub` against a Hub-shaped HTTP server on 127.0.0.1 that each test
//! starts and stops: the resolve endpoint (HEAD with X-Repo-Commit, ETag or
//! X-Linked-Etag and sizes; a large file redirected to a "CDN" path that honours
//! `Range`), serving a tiny model the test builds.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{nodes_with, stderr, Project};
use sha2::Digest;

const REPO: &str = "test-org/tiny-qwen";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// Served as a large (LFS) file: redirected, with X-Linked-Etag = its SHA-256.
const LARGE: &str = "model.safetensors";
/// The dataset repo of the `dataset.hub` tests (same server, `/datasets/…`).
const DATASET: &str = "test-org/tiny-gsm";

/// Whether a served file is a large (LFS) one: the weights, and Parquet files as the Hub stores them.
fn is_large(name: &str) -> bool {
    name == LARGE || name.ends_with(".parquet")
}

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

#[derive(Default)]
struct Behaviour {
    /// Refuse (401) any request on the resolve and tree endpoints without this bearer token.
    token: Option<String>,
    /// Serve the large file with one byte flipped (the announced hash unchanged).
    corrupt: bool,
    /// Send this many bytes of the large file, then hold the connection open.
    stall_after: Option<usize>,
    /// Stall only the first download of the large file (a flaky link).
    stall_once: bool,
}

struct Hub {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

/// Git's blob id, as the Hub's ETag of a small file (computed with
/// `git hash-object` where git is installed, so this test does not trust the
/// code under test's own hashing).
fn git_blob_id(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("blob");
    std::fs::write(&f, bytes).unwrap();
    let out = std::process::Command::new("git").args(["hash-object"]).arg(&f).output().expect("git is installed");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl Hub {
    fn start(files: BTreeMap<String, Vec<u8>>) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Mutex::new(Behaviour::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let files = Arc::new(files);
        let etags: Arc<BTreeMap<String, String>> = Arc::new(
            files.iter().map(|(n, b)| (n.clone(), if is_large(n) { sha256(b) } else { git_blob_id(b) })).collect(),
        );
        let thread = {
            let (seen, behaviour, stop) = (seen.clone(), behaviour.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (seen, behaviour, stop, files, etags) =
                                (seen.clone(), behaviour.clone(), stop.clone(), files.clone(), etags.clone());
                            std::thread::spawn(move || {
                                let _ = serve(stream, &seen, &behaviour, &stop, &files, &etags);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Hub { port, seen, behaviour, stop, thread: Some(thread) }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn set(&self, f: impl FnOnce(&mut Behaviour)) {
        f(&mut self.behaviour.lock().unwrap());
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    mut stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    behaviour: &Mutex<Behaviour>,
    stop: &AtomicBool,
    files: &BTreeMap<String, Vec<u8>>,
    etags: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let auth = headers.get("authorization").cloned();
    let range = headers.get("range").cloned();
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        auth: auth.clone(),
    });
    let head = method == "HEAD";
    let respond = |stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]| {
        let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if !headers.iter().any(|(k, _)| *k == "Content-Length") {
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        out.push_str("\r\n");
        stream.write_all(out.as_bytes())?;
        if !head {
            stream.write_all(body)?;
        }
        stream.flush()
    };
    // The tree listing of a dataset folder, as `huggingface_hub.list_repo_tree` reads it.
    if let Some(folder) = path.strip_prefix(&format!("/api/datasets/{DATASET}/tree/{COMMIT}/")) {
        let token = behaviour.lock().unwrap().token.clone();
        if token.is_some_and(|t| auth.as_deref() != Some(format!("Bearer {t}").as_str())) {
            return respond(&mut stream, "401 Unauthorized", &[("X-Error-Code", "GatedRepo".into())], b"");
        }
        let prefix = format!("{folder}/");
        let entries: Vec<serde_json::Value> = files
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix) && !n[prefix.len()..].contains('/'))
            .map(|(n, b)| serde_json::json!({"type": "file", "oid": etags[n], "size": b.len(), "path": n}))
            .collect();
        if entries.is_empty() {
            return respond(&mut stream, "404 Not Found", &[("X-Error-Code", "EntryNotFound".into())], b"");
        }
        return respond(
            &mut stream,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            serde_json::to_string(&entries).unwrap().as_bytes(),
        );
    }
    let resolve = format!("/{REPO}/resolve/{COMMIT}/");
    let dataset_resolve = format!("/datasets/{DATASET}/resolve/{COMMIT}/");
    if let Some(file) = path.strip_prefix(&resolve).or_else(|| path.strip_prefix(&dataset_resolve)) {
        let token = behaviour.lock().unwrap().token.clone();
        if let Some(t) = token {
            if auth.as_deref() != Some(format!("Bearer {t}").as_str()) {
                return respond(&mut stream, "401 Unauthorized", &[("X-Error-Code", "GatedRepo".into())], b"");
            }
        }
        let Some(bytes) = files.get(file) else {
            return respond(&mut stream, "404 Not Found", &[("X-Error-Code", "EntryNotFound".into())], b"");
        };
        let etag = &etags[file];
        let common = [("X-Repo-Commit", COMMIT.to_string()), ("ETag", format!("\"{etag}\""))];
        if is_large(file) {
            let mut h = common.to_vec();
            h.push(("X-Linked-Etag", format!("\"{etag}\"")));
            h.push(("X-Linked-Size", bytes.len().to_string()));
            h.push(("Location", format!("/cdn/{etag}")));
            return respond(&mut stream, "302 Found", &h, b"");
        }
        return respond(&mut stream, "200 OK", &common, bytes);
    }
    if let Some(hash) = path.strip_prefix("/cdn/") {
        let Some(name) = etags.iter().find(|(_, e)| *e == hash).map(|(n, _)| n.clone()) else {
            return respond(&mut stream, "404 Not Found", &[], b"");
        };
        let mut bytes = files[&name].clone();
        let (corrupt, stall) = {
            let mut b = behaviour.lock().unwrap();
            let stall = if head { None } else { b.stall_after };
            if stall.is_some() && b.stall_once {
                b.stall_after = None;
            }
            (b.corrupt, stall)
        };
        if corrupt {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
        }
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let total = bytes.len();
        let body = &bytes[from..];
        let (status, mut h) = if range.is_some() {
            ("206 Partial Content", vec![("Content-Range", format!("bytes {from}-{}/{total}", total - 1))])
        } else {
            ("200 OK", vec![])
        };
        h.push(("Content-Length", body.len().to_string()));
        if let Some(n) = stall.filter(|_| !head) {
            let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
            for (k, v) in &h {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            stream.write_all(out.as_bytes())?;
            stream.write_all(&body[..n.min(body.len())])?;
            stream.flush()?;
            // Hold the connection until the test stops the server.
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Ok(());
        }
        return respond(&mut stream, status, &h, body);
    }
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest);
    respond(&mut stream, "404 Not Found", &[], b"")
}

/// A tiny model built by the spec, as the Hub's file list.
fn tiny_model(p: &Project) -> BTreeMap<String, Vec<u8>> {
    p.write("tiny.yaml", &common::tiny_spec("tiny", ""));
    p.run_json(&["tiny.yaml"], 0);
    let out = p.run(&["path", "tiny.yaml", "base:model"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    ["config.json", "tokenizer.json", "generation_config.json", LARGE]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap()))
        .collect()
}

fn hub_spec(p: &Project, revision: &str) {
    p.write(
        "hub.yaml",
        &format!("name: hub\nnodes:\n  qwen:\n    op: model.hub\n    params: {{repo: {REPO}, revision: {revision}}}\n"),
    );
}

/// `orchestrate run --json hub.yaml` with the Hugging Face variables of this test only.
fn hub_cmd(p: &Project, endpoint: &str, cache: &Path, extra: &[(&str, &str)]) -> std::process::Command {
    let mut c = p.cmd(&["run", "--json", "hub.yaml"]);
    for v in ["HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME", "HF_ENDPOINT", "HF_TOKEN_PATH"] {
        c.env_remove(v);
    }
    c.env("HF_ENDPOINT", endpoint).env("HF_HUB_CACHE", cache).env("HF_HOME", p.path().join("hf-home"));
    for (k, v) in extra {
        c.env(k, v);
    }
    c
}

fn run_hub(p: &Project, endpoint: &str, cache: &Path, extra: &[(&str, &str)]) -> std::process::Output {
    hub_cmd(p, endpoint, cache, extra).output().unwrap()
}

fn failure(out: &std::process::Output) -> String {
    let ev = common::events(out);
    ev.iter()
        .find(|e| e["event"] == "node_failed")
        .unwrap_or_else(|| panic!("no node failed: {}\n{}", String::from_utf8_lossy(&out.stdout), stderr(out)))["error"]
        .as_str()
        .unwrap()
        .to_string()
}

fn repo_dir(cache: &Path) -> PathBuf {
    cache.join("models--test-org--tiny-qwen")
}

#[test]
fn a_pinned_model_is_fetched_into_the_hf_cache_reused_without_network_and_readable_by_huggingface_hub() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files.clone());
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");

    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(nodes_with(&common::events(&out), "node_finished"), ["qwen"]);
    // The output holds the served bytes.
    let model = p.run(&["path", "hub.yaml", "qwen:model"]);
    let model = PathBuf::from(String::from_utf8_lossy(&model.stdout).trim());
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(model.join(name)).unwrap(), bytes, "{name}");
    }
    // huggingface_hub's layout: blobs named by hash, relative snapshot links.
    let blob = repo_dir(&cache).join("blobs").join(sha256(&files[LARGE]));
    assert_eq!(std::fs::read(&blob).unwrap(), files[LARGE]);
    let pointer = repo_dir(&cache).join("snapshots").join(COMMIT).join(LARGE);
    let link = std::fs::read_link(&pointer).unwrap();
    assert!(link.is_relative(), "{}", link.display());
    assert_eq!(std::fs::canonicalize(&pointer).unwrap(), std::fs::canonicalize(&blob).unwrap());
    let config_blob = repo_dir(&cache).join("blobs").join(git_blob_id(&files["config.json"]));
    assert!(config_blob.is_file(), "{}", config_blob.display());
    // The large file came from the CDN location, the rest from resolve.
    let seen = hub.seen();
    assert!(seen.iter().any(|s| s.method == "GET" && s.path.starts_with("/cdn/")), "{seen:?}");
    assert!(seen.iter().all(|s| s.auth.is_none()), "no token configured, none sent");

    // Python's huggingface_hub finds it offline, where transformers would look.
    {
        let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
        let script = format!(
            "from huggingface_hub import hf_hub_download\nprint(hf_hub_download('{REPO}', '{LARGE}', revision='{COMMIT}', \
             cache_dir={:?}, local_files_only=True))",
            cache.display().to_string()
        );
        let py = std::process::Command::new(python).args(["-c", &script]).env("HF_HUB_OFFLINE", "1").output().unwrap();
        assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
        assert_eq!(String::from_utf8_lossy(&py.stdout).trim(), pointer.display().to_string());
    }

    // Without the server: a new workspace fetches nothing and reuses the cache.
    drop(hub);
    let before = std::fs::read_dir(p.path().join(".orchestrate")).is_ok();
    assert!(before);
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("old-workspace")).unwrap();
    let out = run_hub(&p, "http://127.0.0.1:9", &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(nodes_with(&common::events(&out), "node_finished"), ["qwen"]);

    // Offline with an empty cache: a clear error naming the missing file.
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("old-workspace-2")).unwrap();
    let empty = p.path().join("empty-cache");
    let out = run_hub(&p, "http://127.0.0.1:9", &empty, &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("HF_HUB_OFFLINE") && e.contains("config.json") && e.contains(REPO) && e.contains(COMMIT), "{e}");

    // A blob edited in the cache is not used.
    let mut damaged = files[LARGE].clone();
    damaged[10] ^= 1;
    let mut perms = std::fs::metadata(&blob).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&blob, perms).unwrap();
    std::fs::write(&blob, &damaged).unwrap();
    let out = run_hub(&p, "http://127.0.0.1:9", &cache, &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("damaged") && e.contains(LARGE), "{e}");
}

#[test]
fn wrong_bytes_from_the_hub_are_refused_and_deleted() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files.clone());
    hub.set(|b| b.corrupt = true);
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains(LARGE) && e.contains("announced") && e.contains(&sha256(&files[LARGE])), "{e}");
    let blobs: Vec<String> = std::fs::read_dir(repo_dir(&cache).join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!blobs.iter().any(|b| b.starts_with(&sha256(&files[LARGE]))), "nothing of it is kept: {blobs:?}");
    assert!(!repo_dir(&cache).join("snapshots").join(COMMIT).join(LARGE).exists());
    // Nothing in the store either: the node has no output.
    assert_ne!(p.run(&["path", "hub.yaml", "qwen:model"]).status.code(), Some(0));
    // The honest server then serves it.
    hub.set(|b| b.corrupt = false);
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_download_killed_half_way_resumes_from_where_it_stopped() {
    let p = Project::new();
    let files = tiny_model(&p);
    let half = files[LARGE].len() / 2;
    let hub = Hub::start(files.clone());
    hub.set(|b| b.stall_after = Some(half));
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    let partial = repo_dir(&cache).join("blobs").join(format!("{}.incomplete", sha256(&files[LARGE])));

    let mut c = hub_cmd(&p, &hub.endpoint(), &cache, &[]);
    let mut child = c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let t = Instant::now();
    while std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0) < half as u64 {
        assert!(t.elapsed() < Duration::from_secs(60), "the download never reached half way");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!repo_dir(&cache).join("blobs").join(sha256(&files[LARGE])).exists(), "a killed download is not a blob");
    assert!(!repo_dir(&cache).join("snapshots").join(COMMIT).join(LARGE).exists());

    hub.set(|b| b.stall_after = None);
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let resumed: Vec<Seen> =
        hub.seen().into_iter().filter(|s| s.path.starts_with("/cdn/") && s.range.is_some()).collect();
    assert_eq!(resumed.len(), 1, "{:?}", hub.seen());
    assert_eq!(resumed[0].range.as_deref(), Some(format!("bytes={half}-").as_str()));
    assert_eq!(std::fs::read(repo_dir(&cache).join("blobs").join(sha256(&files[LARGE]))).unwrap(), files[LARGE]);
    assert!(!partial.exists());
}

#[test]
fn a_branch_name_is_refused_before_any_request_with_how_to_find_the_commit() {
    let p = Project::new();
    let hub = Hub::start(BTreeMap::new());
    hub_spec(&p, "main");
    let out = p.run(&["validate", "hub.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(e.contains("revision") && e.contains("'main' is not a commit") && e.contains("git ls-remote"), "{e}");
    let out = run_hub(&p, &hub.endpoint(), &p.path().join("c"), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(hub.seen().is_empty(), "{:?}", hub.seen());
}

#[test]
fn a_401_is_explained_and_the_token_from_hf_token_opens_the_repo() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files);
    hub.set(|b| b.token = Some("hf_right".into()));
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("401") && e.contains("HF_TOKEN") && e.contains("gated") && e.contains(REPO), "{e}");
    let out = run_hub(&p, &hub.endpoint(), &cache, &[("HF_TOKEN", "hf_wrong")]);
    let e = failure(&out);
    assert!(e.contains("401") && e.contains("was refused"), "{e}");
    // The token never appears in what orchestrate prints.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hf_wrong") && !stderr(&out).contains("hf_wrong"));
    let out = run_hub(&p, &hub.endpoint(), &cache, &[("HF_TOKEN", "hf_right")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(hub.seen().iter().any(|s| s.auth.as_deref() == Some("Bearer hf_right")));
}

/// A symlink planted at the download's `.incomplete` name: before, the
/// download was appended to the file it pointed to (32 B grew to 3.5 MB).
#[test]
fn a_link_planted_at_the_partial_download_is_never_written_through() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files.clone());
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    let victim = p.write("victim.txt", "32 bytes of somebody's own file\n");
    let blobs = repo_dir(&cache).join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::os::unix::fs::symlink(&victim, blobs.join(format!("{}.incomplete", sha256(&files[LARGE])))).unwrap();
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(p.read("victim.txt"), "32 bytes of somebody's own file\n");
    assert_eq!(std::fs::read(blobs.join(sha256(&files[LARGE]))).unwrap(), files[LARGE]);
}

/// Planted cache contents are never used under the genuine key: each file is
/// checked against the hash the Hub announces, whatever its form in the cache.
#[test]
fn planted_cache_contents_are_checked_against_the_hub_and_replaced() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files.clone());
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    assert_eq!(run_hub(&p, &hub.endpoint(), &cache, &[]).status.code(), Some(0));
    let snap = repo_dir(&cache).join("snapshots").join(COMMIT);
    // A plain file with edited weights, and generation_config.json pointing at config.json's blob.
    let mut edited = files[LARGE].clone();
    edited[100] ^= 1;
    std::fs::remove_file(snap.join(LARGE)).unwrap();
    std::fs::write(snap.join(LARGE), &edited).unwrap();
    std::fs::remove_file(snap.join("generation_config.json")).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{}", git_blob_id(&files["config.json"])),
        snap.join("generation_config.json"),
    )
    .unwrap();
    // A marker saying a file the Hub has is absent.
    std::fs::create_dir_all(repo_dir(&cache).join(".no_exists").join(COMMIT)).unwrap();
    std::fs::write(repo_dir(&cache).join(".no_exists").join(COMMIT).join("generation_config.json"), "").unwrap();
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("ws-1")).unwrap();
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let model = p.run(&["path", "hub.yaml", "qwen:model"]);
    let model = PathBuf::from(String::from_utf8_lossy(&model.stdout).trim());
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(model.join(name)).unwrap(), bytes, "{name} is the Hub's, not the planted one");
    }
    // Offline, the hashes recorded at fetch time catch a pointer moved to another file's blob.
    std::fs::remove_file(snap.join("generation_config.json")).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{}", git_blob_id(&files["config.json"])),
        snap.join("generation_config.json"),
    )
    .unwrap();
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("ws-2")).unwrap();
    let out = run_hub(&p, "http://127.0.0.1:9", &cache, &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = failure(&out);
    assert!(e.contains("generation_config.json") && e.contains("altered"), "{e}");
}

#[test]
fn a_snapshot_folder_that_is_a_link_is_refused_and_not_written_into() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files.clone());
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    let elsewhere = p.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    for (name, bytes) in &files {
        std::fs::write(elsewhere.join(name), bytes).unwrap();
    }
    std::fs::create_dir_all(repo_dir(&cache).join("snapshots")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, repo_dir(&cache).join("snapshots").join(COMMIT)).unwrap();
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = failure(&out);
    assert!(e.contains("is a link") && e.contains(COMMIT), "{e}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        files.len(),
        "nothing was written into the linked folder"
    );
}

/// A server that sends the headers and 1,000 bytes and goes silent: before,
/// `run` hung forever. Now the read gives up after HF_HUB_DOWNLOAD_TIMEOUT and
/// the next attempt resumes from byte 1,000 with `Range`.
#[test]
fn a_stalled_download_times_out_and_the_retry_resumes_with_range() {
    let p = Project::new();
    let files = tiny_model(&p);
    let hub = Hub::start(files.clone());
    hub.set(|b| {
        b.stall_after = Some(1000);
        b.stall_once = true;
    });
    hub_spec(&p, COMMIT);
    let cache = p.path().join("hf-cache");
    let t = Instant::now();
    let out = run_hub(&p, &hub.endpoint(), &cache, &[("HF_HUB_DOWNLOAD_TIMEOUT", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(t.elapsed() < Duration::from_secs(30), "took {:?}", t.elapsed());
    let ranges: Vec<Option<String>> =
        hub.seen().into_iter().filter(|s| s.path.starts_with("/cdn/") && s.method == "GET").map(|s| s.range).collect();
    assert_eq!(ranges, [None, Some("bytes=1000-".to_string())], "{:?}", hub.seen());
    assert_eq!(std::fs::read(repo_dir(&cache).join("blobs").join(sha256(&files[LARGE]))).unwrap(), files[LARGE]);
    // A server that always stalls: a clear error after the attempts, not a hang.
    let p2 = Project::new();
    hub_spec(&p2, COMMIT);
    hub.set(|b| {
        b.stall_after = Some(1000);
        b.stall_once = false;
    });
    let t = Instant::now();
    let out = run_hub(&p2, &hub.endpoint(), &p2.path().join("hf-cache"), &[("HF_HUB_DOWNLOAD_TIMEOUT", "1")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(t.elapsed() < Duration::from_secs(40), "took {:?}", t.elapsed());
    let e = failure(&out);
    assert!(e.contains("no byte of the body arrived") && e.contains("gave up after 5 attempts"), "{e}");
}

// ---- dataset.hub: a dataset repo pinned by commit, through the same cache code ----

/// GSM8K-style rows.
fn gsm_rows(range: std::ops::Range<usize>) -> Vec<serde_json::Value> {
    range
        .map(|i| {
            serde_json::json!({
                "question": format!("Ann has {i} pens and gets {} more. How many pens? (#{i})", i + 2),
                "answer": format!("{i} + {} = {}\n#### {}", i + 2, 2 * i + 2, 2 * i + 2),
            })
        })
        .collect()
}

/// Rows as Parquet bytes, written by pyarrow (snappy), as the Hub's converter writes them.
fn parquet_bytes(rows: &[serde_json::Value]) -> Vec<u8> {
    let python = std::env::var("ORCHESTRATE_PYTHON").expect("ORCHESTRATE_PYTHON (source .setup/env.sh)");
    let dir = tempfile::tempdir().unwrap();
    let (json, out) = (dir.path().join("rows.json"), dir.path().join("rows.parquet"));
    std::fs::write(&json, serde_json::to_string(rows).unwrap()).unwrap();
    let script = "import json, sys\nimport pyarrow as pa, pyarrow.parquet as pq\npq.write_table(pa.Table.from_pylist(json.load(open(sys.argv[1]))), sys.argv[2], compression='snappy')\n";
    let st = std::process::Command::new(python).args(["-c", script]).arg(&json).arg(&out).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    std::fs::read(out).unwrap()
}

const GSM_FIELDS: &str = "fields: {prompt: question, answer: answer, reference_response: answer}";

#[test]
fn a_pinned_dataset_is_fetched_into_the_hf_cache_split_by_the_hubs_layout_and_reused_offline() {
    let p = Project::new();
    let files: BTreeMap<String, Vec<u8>> = [
        ("main/train-00000-of-00002.parquet", parquet_bytes(&gsm_rows(0..10))),
        ("main/train-00001-of-00002.parquet", parquet_bytes(&gsm_rows(10..16))),
        ("main/test-00000-of-00001.parquet", parquet_bytes(&gsm_rows(16..20))),
        // Neither is a file of split 'train' of config 'main'.
        ("main/trainer-notes.parquet", parquet_bytes(&gsm_rows(20..21))),
        ("socratic/train-00000-of-00001.parquet", parquet_bytes(&gsm_rows(30..31))),
        ("README.md", b"# tiny-gsm\n".to_vec()),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect();
    let hub = Hub::start(files.clone());
    let cache = p.path().join("hf-cache");
    // The same rows as local JSON lines, imported: the reference for what the Hub gives.
    let jsonl = |rows: Vec<serde_json::Value>| rows.iter().map(|r| r.to_string() + "\n").collect::<String>();
    p.write("train.jsonl", &jsonl(gsm_rows(0..16)));
    p.write("test.jsonl", &jsonl(gsm_rows(16..20)));
    p.write(
        "hub.yaml",
        &format!(
            "name: dh\nnodes:\n  gsm:\n    op: dataset.hub\n    params: {{repo: {DATASET}, revision: {COMMIT}, config: main, splits: {{train: train, test: test}}, warmstart: 4, {GSM_FIELDS}}}\n  local:\n    op: dataset.import\n    params: {{files: {{train: train.jsonl, test: test.jsonl}}, warmstart: 4, {GSM_FIELDS}}}\n"
        ),
    );
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let bytes = |output: &str| {
        let o = p.run(&["path", "hub.yaml", output]);
        assert_eq!(o.status.code(), Some(0), "{output}: {}", stderr(&o));
        std::fs::read(String::from_utf8_lossy(&o.stdout).trim()).unwrap()
    };
    for output in ["pages.train", "labels.train", "pages.test", "labels.test"] {
        assert!(
            bytes(&format!("gsm:{output}")) == bytes(&format!("local:{output}")),
            "gsm:{output} differs from the local import"
        );
    }
    // huggingface_hub's layout, under datasets--owner--name; the decoys were never fetched.
    let repo = cache.join("datasets--test-org--tiny-gsm");
    let snapshot = repo.join("snapshots").join(COMMIT).join("main");
    assert!(snapshot.join("train-00001-of-00002.parquet").exists());
    assert!(!snapshot.join("trainer-notes.parquet").exists());
    let blob = repo.join("blobs").join(sha256(&files["main/test-00000-of-00001.parquet"]));
    assert!(blob.is_file(), "{}", blob.display());
    let seen = hub.seen();
    assert!(seen.iter().any(|s| s.path == format!("/api/datasets/{DATASET}/tree/{COMMIT}/main")), "{seen:?}");
    assert!(!seen.iter().any(|s| s.path.contains("socratic") || s.path.contains("trainer-notes")), "{seen:?}");

    // openai/gsm8k has no validation split: `validation_from_train: 3` makes the
    // last 3 train rows (in file order) the validation split.
    p.write("tr13.jsonl", &jsonl(gsm_rows(0..13)));
    p.write("va3.jsonl", &jsonl(gsm_rows(13..16)));
    p.write(
        "hub.yaml",
        &format!(
            "name: dh\nnodes:\n  gsm:\n    op: dataset.hub\n    params: {{repo: {DATASET}, revision: {COMMIT}, config: main, splits: {{train: train, test: test}}, validation_from_train: 3, warmstart: 4, {GSM_FIELDS}}}\n  local:\n    op: dataset.import\n    params: {{files: {{train: tr13.jsonl, validation: va3.jsonl, test: test.jsonl}}, warmstart: 4, {GSM_FIELDS}}}\n"
        ),
    );
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    for output in ["pages.train", "labels.train", "pages.validation", "labels.validation"] {
        assert!(bytes(&format!("gsm:{output}")) == bytes(&format!("local:{output}")), "gsm:{output} differs");
    }

    // A new workspace, offline, the server gone: the cache lists and serves the files.
    drop(hub);
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("old-workspace")).unwrap();
    let out = run_hub(&p, "http://127.0.0.1:9", &cache, &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(nodes_with(&common::events(&out), "node_finished").contains(&"gsm".to_string()));
    // Offline with an empty cache: an error naming the folder and how to fill it.
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("old-workspace-2")).unwrap();
    let out = run_hub(&p, "http://127.0.0.1:9", &p.path().join("empty"), &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("main of test-org/tiny-gsm") && e.contains("not in the cache"), "{e}");
}

#[test]
fn a_dataset_file_with_wrong_bytes_or_a_missing_split_fails_and_caches_nothing() {
    let p = Project::new();
    let files: BTreeMap<String, Vec<u8>> =
        [("main/train-00000-of-00001.parquet".to_string(), parquet_bytes(&gsm_rows(0..6)))].into();
    let hub = Hub::start(files.clone());
    let cache = p.path().join("hf-cache");
    let spec = |splits: &str| {
        format!("name: dh\nnodes:\n  gsm:\n    op: dataset.hub\n    params: {{repo: {DATASET}, revision: {COMMIT}, config: main, splits: {splits}, {GSM_FIELDS}}}\n")
    };
    p.write("hub.yaml", &spec("{train: train, test: test}"));
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("no file of split 'test' in main/") && e.contains("main/train-00000-of-00001.parquet"), "{e}");
    p.write("hub.yaml", &spec("{train: train}"));
    hub.set(|b| b.corrupt = true);
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("train-00000-of-00001.parquet") && e.contains("announced"), "{e}");
    assert_ne!(p.run(&["path", "hub.yaml", "gsm:pages.train"]).status.code(), Some(0));
    // A gated dataset: refused without a token (the listing too), read with HF_TOKEN.
    hub.set(|b| {
        b.corrupt = false;
        b.token = Some("hf_dataset_token".into());
    });
    let out = run_hub(&p, &hub.endpoint(), &cache, &[]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("401") && e.contains("HF_TOKEN"), "{e}");
    let out = run_hub(&p, &hub.endpoint(), &cache, &[("HF_TOKEN", "hf_dataset_token")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hf_dataset_token"), "the token is never printed");
    // A snapshot folder planted as a link to a folder elsewhere is not listed or read, offline.
    let planted = p.path().join("planted-cache");
    let elsewhere = p.path().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("main")).unwrap();
    std::fs::write(elsewhere.join("main/train-00000-of-00001.parquet"), b"not ours").unwrap();
    let snapshots = planted.join("datasets--test-org--tiny-gsm").join("snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    std::os::unix::fs::symlink(&elsewhere, snapshots.join(COMMIT)).unwrap();
    // A new workspace, so the node is not a cache hit.
    std::fs::rename(p.path().join(".orchestrate"), p.path().join("old-workspace")).unwrap();
    let out = run_hub(&p, "http://127.0.0.1:9", &planted, &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(1));
    let e = failure(&out);
    assert!(e.contains("is a link or a file, not a folder") && e.contains("to fetch the files of main/"), "{e}");
    assert_eq!(std::fs::read(elsewhere.join("main/train-00000-of-00001.parquet")).unwrap(), b"not ours");
    // A branch instead of a commit is refused before any request.
    p.write("hub.yaml", &spec("{train: train}").replace(COMMIT, "main"));
    let out = p.run(&["validate", "hub.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not a commit"), "{}", stderr(&out));
}
