//! The shared remote cache against a real S3-compatible server on 127.0.0.1
//! (moto's `moto_server`, started and stopped by each test), and a folder
//! remote: push then pull, `run --remote`, a tampered object, a push killed
//! half-way, concurrent pushes, lying records, missing credentials.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{nodes_with, stderr, stdout, tiny_spec, Project, CHAIN};

/// A moto S3 server on a free loopback port, with one bucket; killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

const BUCKET: &str = "team-cache";

/// moto checks that a request carries credentials, not their signature: the
/// test's own reads and writes (as a tamperer's would) send a placeholder.
const AUTH: &str =
    "AWS4-HMAC-SHA256 Credential=testing/20261201/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";

impl Moto {
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (pip's moto[server]) must be installed: scripts/test.sh installs it");
        let m = Moto { child, port };
        let start = Instant::now();
        loop {
            if let Ok(r) = ureq::put(&format!("{}/{BUCKET}", m.endpoint())).send_empty() {
                assert!(r.status().is_success(), "creating the bucket: {}", r.status());
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "moto_server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Keys under a prefix (ListObjectsV2; moto does not check signatures).
    fn keys(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = format!("{}/{BUCKET}?list-type=2&prefix={prefix}", self.endpoint());
            if let Some(t) = &token {
                url.push_str(&format!(
                    "&continuation-token={}",
                    t.replace('+', "%2B").replace('/', "%2F").replace('=', "%3D")
                ));
            }
            let body = ureq::get(&url).call().unwrap().body_mut().read_to_string().unwrap();
            out.extend(body.split("<Key>").skip(1).map(|s| s.split("</Key>").next().unwrap().to_string()));
            token = body.split("<NextContinuationToken>").nth(1).map(|s| s.split('<').next().unwrap().to_string());
            if token.is_none() {
                return out;
            }
        }
    }

    fn put(&self, key: &str, bytes: &[u8]) {
        let r = ureq::put(&format!("{}/{BUCKET}/{key}", self.endpoint()))
            .header("Authorization", AUTH)
            .send(bytes)
            .unwrap();
        assert!(r.status().is_success());
    }

    fn get(&self, key: &str) -> String {
        let url = format!("{}/{BUCKET}/{key}", self.endpoint());
        ureq::get(&url).header("Authorization", AUTH).call().unwrap().body_mut().read_to_string().unwrap()
    }

    /// `orchestrate ARGS` in a project with this server's credentials and endpoint.
    fn cmd(&self, p: &Project, args: &[&str]) -> Command {
        let mut c = p.cmd(args);
        c.env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", self.endpoint())
            .env_remove("AWS_PROFILE")
            .env_remove("ORCHESTRATE_REMOTE");
        c
    }

    fn run(&self, p: &Project, args: &[&str]) -> std::process::Output {
        self.cmd(p, args).output().unwrap()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const URL: &str = "s3://team-cache/orch";

fn ok(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(out), stderr(out));
    stdout(out)
}

/// Every file under a folder with its bytes, by relative path.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.strip_prefix(root).unwrap().display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn output_path(m: &Moto, p: &Project, spec: &str, output: &str) -> std::path::PathBuf {
    stdout(&m.run(p, &["path", spec, output])).trim().into()
}

/// The tiny data, tokenizer and model (a folder output) plus a shell node.
fn tiny() -> String {
    tiny_spec("tiny", "  note:\n    op: shell\n    params: {cmd: 'echo noted > note.txt', outs: [note.txt]}\n")
}

#[cfg(feature = "torch")]
#[test]
fn push_then_pull_into_an_empty_workspace_gives_identical_bytes_and_a_no_op_run() {
    let m = Moto::start();
    let (a, b) = (Project::new(), Project::new());
    for p in [&a, &b] {
        p.write("t.yaml", &tiny());
    }
    ok(&m.run(&a, &["run", "-q", "t.yaml"]));
    let pushed = ok(&m.run(&a, &["push", "t.yaml", "--remote", URL]));
    assert!(pushed.starts_with("pushed 4 nodes"), "{pushed}");
    // A second push is a no-op: every record is there.
    assert!(ok(&m.run(&a, &["push", "t.yaml", "--remote", URL])).starts_with("pushed 0 nodes"));
    // The layout: records by key, objects by content hash.
    assert_eq!(m.keys("orch/records/").len(), 4);
    assert!(m.keys("orch/objects/").len() > 4, "the model folder's files are objects too");

    let pulled = ok(&m.run(&b, &["pull", "t.yaml", "--remote", URL]));
    assert!(pulled.starts_with("pulled 4 nodes"), "{pulled}");
    for output in ["data:pages.train", "tokenizer:tokenizer", "base:model", "note:note.txt"] {
        let (x, y) = (output_path(&m, &a, "t.yaml", output), output_path(&m, &b, "t.yaml", output));
        if x.is_dir() {
            assert_eq!(tree(&x), tree(&y), "{output}");
        } else {
            assert_eq!(std::fs::read(&x).unwrap(), std::fs::read(&y).unwrap(), "{output}");
        }
    }
    // The shell node's out is checked out into the spec's folder, as `dvc pull` does.
    assert_eq!(b.read("note.txt"), "noted\n");
    let out = m.run(&b, &["run", "--json", "t.yaml"]);
    let ev = common::events(&out);
    assert!(nodes_with(&ev, "node_finished").is_empty(), "nothing runs after a pull: {}", stdout(&out));
    assert_eq!(nodes_with(&ev, "cache_hit").len(), 4);
}

#[cfg(feature = "torch")]
#[test]
fn run_remote_on_a_second_workspace_executes_nothing_the_first_pushed() {
    let m = Moto::start();
    let (a, b) = (Project::new(), Project::new());
    for p in [&a, &b] {
        p.write("t.yaml", &tiny());
    }
    // `run --push` uploads what it ran.
    let out = ok(&m.run(&a, &["run", "t.yaml", "--remote", URL, "--push"]));
    assert!(out.contains("pushed 4 nodes"), "{out}");
    let out = m.run(&b, &["run", "--json", "t.yaml", "--remote", URL]);
    let ev = common::events(&out);
    assert!(nodes_with(&ev, "node_finished").is_empty(), "{}", stdout(&out));
    let hits: Vec<&serde_json::Value> = ev.iter().filter(|e| e["event"] == "cache_hit").collect();
    assert_eq!(hits.len(), 4);
    assert!(hits.iter().all(|e| e["from"] == URL), "{hits:?}");
    // Now cached locally: no remote needed.
    let ev = common::events(&m.run(&b, &["run", "--json", "t.yaml"]));
    assert!(ev.iter().filter(|e| e["event"] == "cache_hit").all(|e| e.get("from").is_none()));
}

#[test]
fn plan_says_cached_remote_for_what_the_remote_has() {
    let m = Moto::start();
    let (a, b) = (Project::new(), Project::new());
    for p in [&a, &b] {
        p.write("chain.yaml", CHAIN);
    }
    ok(&m.run(&a, &["run", "-q", "chain.yaml", "--remote", URL, "--push"]));
    // b has a workspace, and d cached locally.
    ok(&m.run(&b, &["run", "-q", "chain.yaml", "d"]));
    let plan = ok(&m.run(&b, &["plan", "chain.yaml", "--remote", URL]));
    for n in ["a", "b", "c"] {
        assert!(plan.lines().any(|l| l.starts_with(n) && l.contains("cached (remote)")), "{n}: {plan}");
    }
    assert!(plan.lines().any(|l| l.starts_with('d') && l.contains("cached ") && !l.contains("remote")), "{plan}");
}

#[test]
fn a_tampered_remote_object_is_refused_naming_the_object_and_node_and_nothing_is_published() {
    let m = Moto::start();
    let (a, b) = (Project::new(), Project::new());
    for p in [&a, &b] {
        p.write("chain.yaml", CHAIN);
    }
    ok(&m.run(&a, &["run", "-q", "chain.yaml"]));
    ok(&m.run(&a, &["push", "chain.yaml", "--remote", URL]));
    // Replace c's output on the server with other bytes of the same length.
    let c_out = output_path(&m, &a, "chain.yaml", "c:c.txt");
    let hash = c_out.file_name().unwrap().to_string_lossy().to_string();
    let good = std::fs::read(&c_out).unwrap();
    let mut bad = good.clone();
    bad[0] ^= 1;
    m.put(&format!("orch/objects/{}/{hash}", &hash[..2]), &bad);

    let out = m.run(&b, &["pull", "chain.yaml", "--remote", URL]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("node 'c'") && err.contains(&hash) && err.contains("refused"), "{err}");
    // a, b, d arrived; c did not, and no object of its bytes is in the store.
    let plan = ok(&b.run(&["plan", "chain.yaml"]));
    assert!(plan.lines().any(|l| l.starts_with('c') && l.contains("run")), "{plan}");
    assert!(!b.path().join(format!(".orchestrate/objects/{}/{hash}", &hash[..2])).exists());
    let wrong = blake3::hash(&bad).to_hex().to_string();
    assert!(!b.path().join(format!(".orchestrate/objects/{}/{wrong}", &wrong[..2])).exists());
    // run --remote runs c here instead, saying why.
    let out = ok(&m.run(&b, &["run", "chain.yaml", "--remote", URL]));
    assert!(out.contains("running  c") && out.contains("refused"), "{out}");
    assert_eq!(b.read("c.txt").as_bytes(), good);
}

/// A spec of `n` independent shell nodes, each writing a small file.
fn many(n: usize) -> String {
    let mut s = String::from("name: many\nnodes:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  n{i}:\n    op: shell\n    params: {{cmd: 'echo node {i} > o{i}.txt', outs: [o{i}.txt]}}\n"
        ));
    }
    s
}

/// Every record on the server names objects that are there.
fn records_have_objects(m: &Moto) -> usize {
    let objects: std::collections::BTreeSet<String> = m.keys("orch/objects/").into_iter().collect();
    let records = m.keys("orch/records/");
    for r in &records {
        let body: serde_json::Value = serde_json::from_str(&m.get(r)).unwrap();
        for o in body["outputs"].as_array().unwrap() {
            let h = o["hash"].as_str().unwrap();
            assert!(
                objects.contains(&format!("orch/objects/{}/{h}", &h[..2])),
                "record {r} names {h}, which is not there"
            );
        }
    }
    records.len()
}

#[test]
fn a_push_killed_half_way_leaves_no_record_without_its_objects_and_a_second_push_completes_it() {
    let m = Moto::start();
    let p = Project::new();
    p.write("many.yaml", &many(120));
    ok(&p.run(&["run", "-q", "many.yaml"]));
    let start = Instant::now();
    let mut child = m
        .cmd(&p, &["push", "many.yaml", "--remote", URL, "-j", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once some records are up (or it ends first, on a fast machine).
    while m.keys("orch/records/").len() < 10 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = records_have_objects(&m);
    eprintln!("killed with {before} of 120 records pushed");
    assert!(before >= 10);
    let out = ok(&m.run(&p, &["push", "many.yaml", "--remote", URL]));
    assert!(out.contains(&format!("{before} already there")), "{out}");
    assert_eq!(records_have_objects(&m), 120);
}

#[test]
fn two_concurrent_pushes_of_the_same_nodes_are_harmless() {
    let m = Moto::start();
    let (a, b, c) = (Project::new(), Project::new(), Project::new());
    for p in [&a, &b, &c] {
        p.write("many.yaml", &many(40));
    }
    ok(&a.run(&["run", "-q", "many.yaml"]));
    ok(&b.run(&["run", "-q", "many.yaml"]));
    let pushes: Vec<Child> = [&a, &b]
        .iter()
        .map(|p| {
            m.cmd(p, &["push", "many.yaml", "--remote", URL])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in pushes {
        let out = child.wait_with_output().unwrap();
        ok(&out);
    }
    assert_eq!(records_have_objects(&m), 40);
    ok(&m.run(&c, &["pull", "many.yaml", "--remote", URL]));
    assert_eq!(c.read("o7.txt"), "node 7\n");
}

#[test]
fn a_folder_remote_round_trips_and_its_lying_records_are_refused() {
    let (a, b) = (Project::new(), Project::new());
    let remote = tempfile::tempdir().unwrap();
    let url = format!("file://{}", remote.path().display());
    for p in [&a, &b] {
        p.write("chain.yaml", CHAIN);
    }
    ok(&a.run(&["run", "-q", "chain.yaml", "--remote", &url, "--push"]));
    ok(&b.run(&["pull", "chain.yaml", "--remote", &url]));
    assert_eq!(b.read("c.txt"), "ALPHA\nALPHA\n");
    let ev = common::events(&b.run(&["run", "--json", "chain.yaml"]));
    assert!(nodes_with(&ev, "node_finished").is_empty());

    // Records that lie: a size, a path outside the spec's folder, an oversized object.
    let records: Vec<std::path::PathBuf> = walk(&remote.path().join("records"));
    let d =
        records.iter().find(|r| std::fs::read_to_string(r).unwrap().contains("\"node_id\": \"d\"")).unwrap().clone();
    let original = std::fs::read_to_string(&d).unwrap();
    for (lie, expected, env) in [
        (original.replace("\"size\": 6,", "\"size\": 3,"), "more than the 3 bytes", None),
        (
            original.replace("\"workspace_path\": \"d.txt\"", "\"workspace_path\": \"../../outside.txt\""),
            "leaves the spec's folder",
            None,
        ),
        (original.clone(), "over the limit of 4", Some("4")),
        // Before, a record could name any path inside the spec's folder, and
        // `pull` wrote the node's bytes there when it was missing: a git
        // hook, or a `sitecustomize.py` beside the user's scripts. The key
        // does not cover where outputs go, so a record must list exactly the
        // outputs the node declares here.
        (
            original.replace("\"workspace_path\": \"d.txt\"", "\"workspace_path\": \".git/hooks/pre-commit\""),
            "goes to '.git/hooks/pre-commit' in the tree, but node 'd' declares it at 'd.txt'",
            None,
        ),
        (
            original.replace("\"workspace_path\": \"d.txt\"", "\"workspace_path\": \"sitecustomize.py\""),
            "goes to 'sitecustomize.py' in the tree, but node 'd' declares it at 'd.txt'",
            None,
        ),
        (
            original.replace("\"name\": \"d.txt\"", "\"name\": \"e.txt\""),
            "lists the outputs [e.txt], but node 'd' declares [d.txt]",
            None,
        ),
    ] {
        assert!(env.is_some() || lie != original, "the lie changed the record: {expected}");
        std::fs::write(&d, &lie).unwrap();
        let fresh = Project::new();
        fresh.write("chain.yaml", CHAIN);
        let mut cmd = fresh.cmd(&["pull", "chain.yaml", "--remote", &url]);
        if let Some(max) = env {
            cmd.env("ORCHESTRATE_REMOTE_MAX_BYTES", max);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{lie}");
        assert!(stderr(&out).contains(expected), "{expected}: {}", stderr(&out));
        assert!(!fresh.path().join("d.txt").exists() && !Path::new("/outside.txt").exists());
        for planted in [".git/hooks/pre-commit", "sitecustomize.py", "e.txt"] {
            assert!(!fresh.path().join(planted).exists(), "{expected}: the pull wrote {planted}");
        }
    }
    std::fs::write(&d, &original).unwrap();
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn missing_credentials_are_a_usage_error_and_no_secret_is_written_anywhere() {
    let m = Moto::start();
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    ok(&p.run(&["run", "-q", "chain.yaml"]));
    let out = p
        .cmd(&["push", "chain.yaml", "--remote", URL])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("HOME", p.path())
        .env("AWS_ENDPOINT_URL", m.endpoint())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no AWS credentials") && stderr(&out).contains("AWS_ACCESS_KEY_ID"),
        "{}",
        stderr(&out)
    );
    // A profile in the shared credentials file works, and the secret is nowhere in the workspace.
    p.write(".aws/credentials", "[team]\naws_access_key_id = KEYID123\naws_secret_access_key = SECRET-s3cr3t\n");
    p.write(".orchestrate/config.yaml", &format!("remote:\n  url: {URL}\n  jobs: 2\n"));
    // `push` with the credentials of profile `team` of $HOME/.aws/credentials only.
    let push_as_team = || {
        p.cmd(&["push", "chain.yaml"])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env("HOME", p.path())
            .env("AWS_PROFILE", "team")
            .env("AWS_ENDPOINT_URL", m.endpoint())
            .output()
            .unwrap()
    };
    let out = push_as_team();
    assert!(ok(&out).starts_with("pushed 4 nodes"));
    for f in walk(&p.path().join(".orchestrate")) {
        let bytes = std::fs::read(&f).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("SECRET-s3cr3t"), "{}", f.display());
    }
    // The user's own credentials file may be a link, as a dotfile manager
    // makes it (the AWS CLI follows it too).
    let real = p.write("dotfiles/aws-credentials", &p.read(".aws/credentials"));
    std::fs::remove_file(p.path().join(".aws/credentials")).unwrap();
    std::os::unix::fs::symlink(&real, p.path().join(".aws/credentials")).unwrap();
    let out = push_as_team();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // One that cannot be read (here a FIFO, never waited on) is said as such,
    // not as "no credentials".
    std::fs::remove_file(p.path().join(".aws/credentials")).unwrap();
    common::mkfifo(&p.path().join(".aws/credentials"));
    let out = push_as_team();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains(".aws/credentials cannot be read: not a regular file"), "{said}");
    // A config that is not what it should be names the file and the field.
    p.write(".orchestrate/config.yaml", "remote:\n  uri: s3://x/y\n");
    let out = p.run(&["push", "chain.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("config.yaml") && stderr(&out).contains("uri"), "{}", stderr(&out));
}

#[test]
fn a_large_output_goes_up_in_parts_and_comes_back_identical() {
    let m = Moto::start();
    let (a, b) = (Project::new(), Project::new());
    let spec = "name: big\nnodes:\n  big:\n    op: shell\n    params: {cmd: 'head -c 12000000 /dev/urandom > big.bin', outs: [big.bin]}\n";
    for p in [&a, &b] {
        p.write("big.yaml", spec);
    }
    ok(&a.run(&["run", "-q", "big.yaml"]));
    let out =
        m.cmd(&a, &["push", "big.yaml", "--remote", URL]).env("ORCHESTRATE_S3_PART_BYTES", "5242880").output().unwrap();
    assert!(ok(&out).contains("12000000 bytes"), "{}", stdout(&out));
    // A multipart object's ETag is `"<md5 of the parts' md5s>-<parts>"`: 5 + 5 + 1.4 MB.
    let hash = output_path(&m, &a, "big.yaml", "big:big.bin").file_name().unwrap().to_string_lossy().to_string();
    let url = format!("{}/{BUCKET}/orch/objects/{}/{hash}", m.endpoint(), &hash[..2]);
    let head = ureq::head(&url).header("Authorization", AUTH).call().unwrap();
    let etag = head.headers().get("etag").unwrap().to_str().unwrap().to_string();
    assert!(etag.trim_matches('"').ends_with("-3"), "{etag}");
    // A part size under S3's 5 MiB minimum is a usage error.
    let out =
        m.cmd(&a, &["push", "big.yaml", "--remote", URL]).env("ORCHESTRATE_S3_PART_BYTES", "1000").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    ok(&m.run(&b, &["pull", "big.yaml", "--remote", URL]));
    assert_eq!(std::fs::read(b.path().join("big.bin")).unwrap(), std::fs::read(a.path().join("big.bin")).unwrap());
}

#[test]
fn a_damaged_local_object_is_never_pushed_nor_any_record_that_names_it() {
    let p = Project::new();
    let remote = tempfile::tempdir().unwrap();
    let url = format!("file://{}", remote.path().display());
    // Two nodes whose outputs have the same bytes: one object, two records.
    p.write(
        "same.yaml",
        "name: same\nnodes:\n  x: {op: shell, params: {cmd: 'echo same > x.txt', outs: [x.txt]}}\n  y: {op: shell, params: {cmd: 'echo same > y.txt', outs: [y.txt]}}\n  z: {op: shell, params: {cmd: 'echo other > z.txt', outs: [z.txt]}}\n",
    );
    ok(&p.run(&["run", "-q", "same.yaml"]));
    let object = std::path::PathBuf::from(stdout(&p.run(&["path", "same.yaml", "x:x.txt"])).trim());
    std::fs::set_permissions(&object, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&object, "sane\n").unwrap();
    let out = p.run(&["push", "same.yaml", "--remote", &url]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("is damaged"), "{}", stderr(&out));
    let records: Vec<String> =
        walk(&remote.path().join("records")).iter().map(|r| std::fs::read_to_string(r).unwrap()).collect();
    assert_eq!(records.len(), 1, "only z: {records:?}");
    assert!(records[0].contains("\"node_id\": \"z\""));
    assert!(walk(&remote.path().join("objects")).iter().all(|o| std::fs::read_to_string(o).unwrap() != "sane\n"));
}

/// Issue #30: a record whose hash inputs were edited (its `cmd`) still sat
/// under its old key, so `plan` said cached while `explain` listed the change.
/// The key is recomputed from the record and must be the name it is under.
#[test]
fn a_remote_record_whose_hash_inputs_were_edited_is_refused_and_the_node_runs_here() {
    let a = Project::new();
    let remote = tempfile::tempdir().unwrap();
    let url = format!("file://{}", remote.path().display());
    a.write("chain.yaml", CHAIN);
    ok(&a.run(&["run", "-q", "chain.yaml", "--remote", &url, "--push"]));
    let records = walk(&remote.path().join("records"));
    let rec = records.iter().find(|r| std::fs::read_to_string(r).unwrap().contains("\"node_id\": \"a\"")).unwrap();
    let original = std::fs::read_to_string(rec).unwrap();
    let edited = original.replace("echo alpha > a.txt", "echo omega > a.txt");
    assert_ne!(edited, original, "the record holds the command");
    let padded = original.replacen('{', &format!("{{\"padding\": \"{}\",", "x".repeat(5 << 20)), 1);
    for (lie, expected) in [(edited, "the record was altered"), (padded, "more than the 4194304 bytes")] {
        std::fs::write(rec, &lie).unwrap();
        let b = Project::new();
        b.write("chain.yaml", CHAIN);
        let out = b.run(&["pull", "chain.yaml", "--remote", &url]);
        assert_eq!(out.status.code(), Some(1), "{expected}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{expected}: {}", stderr(&out));
        assert!(!b.path().join("a.txt").exists());
        // `run --remote` takes nothing of it: a runs here.
        let ev = common::events(&b.run(&["run", "--json", "chain.yaml", "--remote", &url]));
        assert!(nodes_with(&ev, "node_finished").contains(&"a".to_string()), "{expected}: {ev:?}");
        assert_eq!(b.read("a.txt"), "alpha\n");
    }
}

/// What the flaky proxy does with the connection it is given.
#[derive(Clone, Copy, PartialEq)]
enum Flake {
    Internal,
    SlowDown,
    Reset,
    /// Headers and 1,000 bytes of a 100,000-byte body, then silence.
    Stall,
    Forward,
}

/// A proxy on 127.0.0.1 in front of moto: the n-th connection gets
/// `plan(n)` (an S3 error, a reset, or the real server).
struct FlakyProxy {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FlakyProxy {
    fn start(upstream: u16, plan: fn(usize) -> Flake) -> FlakyProxy {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (s, n) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            while !s.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
                let Ok((mut client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let k = n.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let error = |code: &str, status: &str, message: &str| {
                        let body = format!(
                            "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
                        );
                        format!(
                            "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    match plan(k) {
                        Flake::Internal => {
                            let _ = client.write_all(
                                error(
                                    "InternalError",
                                    "500 Internal Server Error",
                                    "We encountered an internal error.",
                                )
                                .as_bytes(),
                            );
                        }
                        Flake::SlowDown => {
                            let _ = client.write_all(
                                error("SlowDown", "503 Slow Down", "Please reduce your request rate.").as_bytes(),
                            );
                        }
                        Flake::Reset => {
                            let mut b = [0u8; 64];
                            let _ = client.read(&mut b);
                            drop(client);
                        }
                        Flake::Stall => {
                            let mut b = [0u8; 4096];
                            let _ = client.read(&mut b);
                            let _ = client.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
                            let _ = client.write_all(&[b'<'; 1000]);
                            std::thread::sleep(Duration::from_secs(30));
                        }
                        Flake::Forward => {
                            let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { return };
                            let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
                            let t = std::thread::spawn(move || {
                                let _ = std::io::copy(&mut c2, &mut u2);
                                let _ = u2.shutdown(std::net::Shutdown::Write);
                            });
                            let (mut up, mut client) = (up, client);
                            let _ = std::io::copy(&mut up, &mut client);
                            let _ = client.shutdown(std::net::Shutdown::Both);
                            let _ = t.join();
                        }
                    }
                });
            }
        });
        FlakyProxy { port, stop, seen }
    }
}

impl FlakyProxy {
    /// `orchestrate ARGS` against moto through this proxy: its exit code and stderr.
    fn run(&self, m: &Moto, p: &Project, args: &[&str], extra: &[(&str, &str)]) -> (Option<i32>, String) {
        let mut c = m.cmd(p, args);
        c.env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.port));
        c.envs(extra.iter().copied());
        let out = c.output().unwrap();
        (out.status.code(), stderr(&out))
    }
}

impl Drop for FlakyProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue #30: a 500, a 503 SlowDown or a reset aborted `push` on the first
/// HEAD with exit 2 and `HTTP 500 ` as the whole message.
#[test]
fn s3_errors_and_resets_are_retried_with_backoff_and_a_lasting_one_is_named_with_exit_1() {
    let m = Moto::start();
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    ok(&p.run(&["run", "-q", "chain.yaml"]));
    // Each of the first connections fails once, in a different way; the retries go through.
    let flaky = FlakyProxy::start(m.port, |k| match k {
        0 => Flake::Internal,
        1 => Flake::Reset,
        _ => Flake::Forward,
    });
    let (code, err) = flaky.run(&m, &p, &["push", "chain.yaml", "--remote", URL], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(flaky.seen.load(std::sync::atomic::Ordering::SeqCst) > 3);
    assert_eq!(m.keys("orch/records/").len(), 4, "every record arrived");
    // Always throttled: exit 1 (a remote failure, not a usage error), S3's code and message said.
    let busy = FlakyProxy::start(m.port, |_| Flake::SlowDown);
    let q = Project::new();
    q.write("chain.yaml", CHAIN);
    ok(&q.run(&["run", "-q", "chain.yaml"]));
    let (code, err) = busy.run(&m, &q, &["push", "chain.yaml", "--remote", URL], &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("HTTP 503 Service Unavailable") && err.contains("after 3 attempts"), "{err}");
    // A GET's error document names S3's code and message.
    let r = Project::new();
    r.write("chain.yaml", CHAIN);
    let (code, err) = busy.run(&m, &r, &["pull", "chain.yaml", "--remote", URL], &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("SlowDown: Please reduce your request rate") && err.contains("after 3 attempts"), "{err}");
}

/// Issue #30: a server that sends headers and 1,000 bytes and goes silent
/// hung `pull` forever; now the read gives up after ORCHESTRATE_S3_TIMEOUT.
#[test]
fn a_stalled_s3_answer_times_out_instead_of_hanging() {
    let m = Moto::start();
    let stalled = FlakyProxy::start(m.port, |_| Flake::Stall);
    let p = Project::new();
    p.write("chain.yaml", CHAIN);
    let t = Instant::now();
    let (code, err) = stalled.run(&m, &p, &["pull", "chain.yaml", "--remote", URL], &[("ORCHESTRATE_S3_TIMEOUT", "1")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}: {err}", t.elapsed());
    assert!(err.contains("no byte of the body arrived"), "{err}");
}

/// A folder out comes back with `pull` (#31): before, `pull` checked out file
/// outs only, and a pulled folder out was missing from the tree until a run.
#[test]
fn pull_checks_a_folder_out_out_into_the_tree() {
    let (a, b) = (Project::new(), Project::new());
    let remote = tempfile::tempdir().unwrap();
    let url = format!("file://{}", remote.path().display());
    let spec = "name: f\nnodes:\n  t:\n    op: shell\n    params: {cmd: 'mkdir -p ckpt/sub && echo w > ckpt/sub/w.bin && echo m > ckpt/m.json', outs: [ckpt]}\n";
    for p in [&a, &b] {
        p.write("f.yaml", spec);
    }
    ok(&a.run(&["run", "-q", "f.yaml", "--remote", &url, "--push"]));
    ok(&b.run(&["pull", "f.yaml", "--remote", &url]));
    assert_eq!(b.read("ckpt/sub/w.bin"), "w\n");
    assert_eq!(b.read("ckpt/m.json"), "m\n");
    let ev = common::events(&b.run(&["run", "--json", "f.yaml"]));
    assert!(nodes_with(&ev, "node_started").is_empty(), "{ev:?}");
    assert!(ev.iter().all(|e| e["restored"].is_null()), "the pull left the folder to a later restore: {ev:?}");
}

/// `orchestrate key generate NAME` in `config` (the user's config folder);
/// returns the `NAME:BASE64` line to trust it by.
fn generate_key(config: &Path, name: &str) -> String {
    let out = Command::new(common::bin())
        .args(["key", "generate", name])
        .env("ORCHESTRATE_CONFIG_DIR", config)
        .output()
        .unwrap();
    let line = ok(&out).trim().to_string();
    assert!(line.starts_with(&format!("{name}:")), "{line}");
    line
}

/// The remote's records of CHAIN by node id, parsed.
fn chain_records(m: &Moto) -> std::collections::BTreeMap<String, (String, serde_json::Value)> {
    m.keys("orch/records/")
        .into_iter()
        .map(|k| {
            let v: serde_json::Value = serde_json::from_str(&m.get(&k)).unwrap();
            (v["node_id"].as_str().unwrap().to_string(), (k, v))
        })
        .collect()
}

/// (Issue #34.) The consistent lie: node a's record edited to name b's
/// valid object and size. Every content check passes; only a signature by a
/// trusted key tells. It is refused where signatures are required (and a
/// runs here), taken and flagged with --trust-unsigned; a record signed by
/// an untrusted key is refused; a second signer who reproduced the result
/// counter-signs it.
#[test]
fn a_consistent_lying_record_is_refused_by_a_workspace_that_requires_signatures() {
    let m = Moto::start();
    let config = tempfile::tempdir().unwrap();
    let alice = generate_key(config.path(), "alice");
    let bob = generate_key(config.path(), "bob");
    // The keys live in the user's config folder, the private one unreadable by others.
    let secret = config.path().join("keys/alice.pem");
    assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
    let again = Command::new(common::bin())
        .args(["key", "generate", "alice"])
        .env("ORCHESTRATE_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2), "a key is never overwritten");
    assert_eq!(
        stdout(
            &Command::new(common::bin())
                .args(["key", "show", "alice"])
                .env("ORCHESTRATE_CONFIG_DIR", config.path())
                .output()
                .unwrap()
        )
        .trim(),
        alice
    );

    let a = Project::new();
    a.write("chain.yaml", CHAIN);
    let pushed = m
        .cmd(&a, &["run", "-q", "chain.yaml", "--remote", URL, "--push", "--key", "alice"])
        .env("ORCHESTRATE_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert!(ok(&pushed).contains("signed with key 'alice'"), "{}", stdout(&pushed));
    let records = chain_records(&m);
    assert_eq!(records.len(), 4);
    assert_eq!(records["a"].1["signatures"][0]["key"], "alice");

    // A workspace that trusts alice takes her records.
    let trusting = |extra: &str| {
        let p = Project::new();
        p.write("chain.yaml", CHAIN);
        p.write(".orchestrate/config.yaml", &format!("trusted_keys: ['{alice}']\n{extra}"));
        p
    };
    let c = trusting("");
    ok(&m.run(&c, &["pull", "chain.yaml", "--remote", URL]));
    assert_eq!(c.read("a.txt"), "alpha\n");

    // The lie: a names b's object (ALPHA, the same size), alice's signature kept.
    let (a_key, mut lie) = records["a"].clone();
    let b_out = records["b"].1["outputs"][0].clone();
    lie["outputs"][0]["hash"] = b_out["hash"].clone();
    lie["outputs"][0]["size"] = b_out["size"].clone();
    m.put(&a_key, serde_json::to_string_pretty(&lie).unwrap().as_bytes());
    // Where nobody is trusted, the lie goes through: the hole this closes.
    let naive = Project::new();
    naive.write("chain.yaml", CHAIN);
    ok(&m.run(&naive, &["pull", "chain.yaml", "a", "--remote", URL]));
    assert_eq!(naive.read("a.txt"), "ALPHA\n");

    let d = trusting("");
    let out = m.run(&d, &["pull", "chain.yaml", "--remote", URL]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad signature by trusted key 'alice'"), "{}", stderr(&out));
    assert!(!d.path().join("a.txt").exists());
    // Even --trust-unsigned does not take a forged trusted signature; `run
    // --remote` runs a here and builds b and c on the true bytes.
    let ev = common::events(&m.run(&d, &["run", "--json", "chain.yaml", "--remote", URL, "--trust-unsigned"]));
    assert!(nodes_with(&ev, "node_finished").contains(&"a".to_string()), "{ev:?}");
    assert_eq!((d.read("a.txt"), d.read("c.txt")), ("alpha\n".to_string(), "ALPHA\nALPHA\n".to_string()));

    // The lie with its signature stripped: unsigned, refused; taken and flagged with --trust-unsigned.
    lie.as_object_mut().unwrap().remove("signatures");
    m.put(&a_key, serde_json::to_string_pretty(&lie).unwrap().as_bytes());
    let e = trusting("");
    let out = m.run(&e, &["pull", "chain.yaml", "a", "--remote", URL]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unsigned; this workspace requires a signature by a trusted key"),
        "{}",
        stderr(&out)
    );
    let out = m.run(&e, &["pull", "chain.yaml", "a", "--remote", URL, "--trust-unsigned"]);
    ok(&out);
    assert!(stderr(&out).contains("unverified (taken by --trust-unsigned): a: unsigned"), "{}", stderr(&out));
    assert_eq!(e.read("a.txt"), "ALPHA\n");
    let f = trusting("");
    let ev = common::events(&m.run(&f, &["run", "--json", "chain.yaml", "a", "--remote", URL, "--trust-unsigned"]));
    let hit = ev.iter().find(|e| e["event"] == "cache_hit" && e["node"] == "a").expect("a came from the remote");
    assert!(hit["from"].as_str().unwrap().contains("unverified: unsigned"), "{hit}");
    m.put(&a_key, serde_json::to_string_pretty(&records["a"].1).unwrap().as_bytes());

    // Signed only by a key this workspace does not trust: refused.
    let g = trusting("");
    let only_bob = serde_json::to_string_pretty(&{
        let mut r = records["d"].1.clone();
        r["signatures"][0]["key"] = "bob".into();
        r
    })
    .unwrap();
    m.put(&records["d"].0, only_bob.as_bytes());
    let out = m.run(&g, &["pull", "chain.yaml", "d", "--remote", URL]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("does not trust (bob)"), "{}", stderr(&out));
    m.put(&records["d"].0, serde_json::to_string_pretty(&records["d"].1).unwrap().as_bytes());

    // Bob reproduces the chain and pushes: he counter-signs the four records,
    // and a workspace that trusts only bob now takes them.
    let b = Project::new();
    b.write("chain.yaml", CHAIN);
    ok(&b.run(&["run", "-q", "chain.yaml"]));
    let out = m
        .cmd(&b, &["push", "chain.yaml", "--remote", URL, "--key", "bob"])
        .env("ORCHESTRATE_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    assert!(ok(&out).contains("counter-signed 4 record(s)"), "{}", stdout(&out));
    let signers: Vec<String> =
        chain_records(&m)["c"].1["signatures"].as_array().unwrap().iter().map(|s| s["key"].to_string()).collect();
    assert_eq!(signers, ["\"alice\"", "\"bob\""]);
    let h = Project::new();
    h.write("chain.yaml", CHAIN);
    h.write(".orchestrate/config.yaml", &format!("trusted_keys: ['{bob}']\n"));
    ok(&m.run(&h, &["pull", "chain.yaml", "--remote", URL]));
    assert_eq!(h.read("c.txt"), "ALPHA\nALPHA\n");
}

/// (Issue #34.) `run --check --remote` verifies a colleague's result before
/// trusting it: from an empty workspace, each node of alice's pushed chain is
/// taken from the remote, re-executed here and compared; with `--push --key
/// bob` what reproduced is counter-signed on the remote.
#[test]
fn run_check_remote_reexecutes_what_the_remote_holds_and_countersigns_what_reproduces() {
    let m = Moto::start();
    let config = tempfile::tempdir().unwrap();
    let alice = generate_key(config.path(), "alice");
    generate_key(config.path(), "bob");
    let a = Project::new();
    a.write("chain.yaml", CHAIN);
    ok(&m
        .cmd(&a, &["run", "-q", "chain.yaml", "--remote", URL, "--push", "--key", "alice"])
        .env("ORCHESTRATE_CONFIG_DIR", config.path())
        .output()
        .unwrap());
    let b = Project::new();
    b.write("chain.yaml", CHAIN);
    b.write(".orchestrate/config.yaml", &format!("trusted_keys: ['{alice}']\n"));
    let out = m
        .cmd(&b, &["run", "chain.yaml", "--check", "--remote", URL, "--push", "--key", "bob"])
        .env("ORCHESTRATE_CONFIG_DIR", config.path())
        .output()
        .unwrap();
    let text = ok(&out);
    for node in ["a", "b", "c", "d"] {
        assert!(text.contains(&format!("reproduced  {node} ")) && text.contains("(from the remote)"), "{text}");
    }
    assert!(text.contains("counter-signed 4 record(s)"), "{text}");
    let signers = chain_records(&m)["c"].1["signatures"].as_array().unwrap().len();
    assert_eq!(signers, 2);
}
