//! `orchestrate events` (search) and `orchestrate alert-scan` (webhook) on a small
//! guarded GRPO run with F3 injected, against a local HTTP server on 127.0.0.1.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::{stderr, stdout, Project};
use serde_json::Value;

fn spec() -> String {
    common::tiny_spec(
        "alerts",
        "  grpo:
    op: train.grpo
    matrix: {guard: ['on', 'off']}
    inputs: {model: 'base:model', pages: 'data:pages.train', labels: 'data:labels.train'}
    params: {iterations: 3, max_new_tokens: 12, lr: 1.0e-4, faults: [{family: F3, at_iteration: 1}, {family: F2, at_iteration: 2}]}
",
    )
}

fn lines(out: &std::process::Output) -> Vec<Value> {
    stdout(out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A one-request-per-connection HTTP server that answers each POST with the next
/// status of `statuses` (then 200) and keeps every body it received.
fn server(statuses: Vec<u16>) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        let mut statuses = statuses.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).unwrap();
            let status = statuses.next().unwrap_or(200);
            if status == 200 {
                seen.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
            }
            let _ = write!(stream, "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, bodies)
}

#[test]
fn events_are_searchable_and_every_non_allow_decision_reaches_the_webhook() {
    let p = Project::new();
    p.write("alerts.yaml", &spec());
    let out = p.run(&["run", "alerts.yaml", "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let metrics = |guard: &str| -> Value {
        let path = stdout(&p.run(&["path", "alerts.yaml", &format!("grpo@guard={guard}:metrics")])).trim().to_string();
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    // What the runs themselves say was refused: (node, iteration, codes).
    let mut refused: Vec<(String, u64, Value)> = metrics("on")["guard"]["detections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| ("grpo@guard=on".to_string(), d["iteration"].as_u64().unwrap(), d["codes"].clone()))
        .collect();
    assert_eq!(refused.len(), 2, "F3 and F2 are each refused once");
    assert!(metrics("off")["guard"]["detections"].as_array().unwrap().is_empty());

    // The headline figures each GRPO node's worker reported, kept in its
    // node_finished event, are those of its metrics: iterations, first and
    // last mean reward, and the iterations the guard refused (two with the
    // guard on, none with it off).
    let finished = lines(&p.run(&["events", "--json", "--type", "node_finished"]));
    for (guard, refused_here) in [("on", 2), ("off", 0)] {
        let node = format!("grpo@guard={guard}");
        let event = finished.iter().find(|e| e["node"] == node.as_str()).unwrap_or_else(|| panic!("{finished:?}"));
        let summary = &event["event"]["summary"];
        let history = metrics(guard)["history"].as_array().unwrap().clone();
        assert_eq!(summary["kind"], "grpo", "{summary}");
        assert_eq!(summary["iterations"].as_u64(), Some(history.len() as u64), "{summary}");
        assert!(summary["first_mean_reward"].is_f64() && summary["last_kl"].is_f64(), "{summary}");
        assert_eq!(summary["first_mean_reward"], history[0]["mean_reward"], "{summary}");
        assert_eq!(summary["last_mean_reward"], history[history.len() - 1]["mean_reward"], "{summary}");
        assert_eq!(summary["refused"].as_u64(), Some(refused_here), "{node}: {summary}");
    }

    // The report of this run: the fault matrix rows with the codes the runs observed.
    let report = p.path().join("report.html");
    let out = p.run(&["report", "--out", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let html = std::fs::read_to_string(&report).unwrap();
    let faults = html.split("<section id=\"faults\">").nth(1).unwrap();
    for (node, iteration, codes) in &refused {
        let row = format!(
            "<td>{node}</td><td>{}</td><td>{iteration}</td><td>on</td>",
            if *iteration == 1 { "F3" } else { "F2" }
        );
        let at = faults.find(&row).unwrap_or_else(|| panic!("{row} in {faults}"));
        let code = codes[0].as_str().unwrap();
        assert!(faults[at..].split("</tr>").next().unwrap().contains(code), "{code}");
    }
    assert_eq!(faults.matches("<td>grpo@guard=off</td>").count(), 2, "two faults in the guard-off run");

    // Search.
    let all = lines(&p.run(&["events", "--json"]));
    assert!(all.iter().any(|e| e["source"] == "engine" && e["type"] == "node_finished"));
    assert!(all.iter().any(|e| e["source"] == "guard" && e["node"] == "grpo@guard=off"));
    let decisions = lines(&p.run(&["events", "--json", "--type", "decision"]));
    assert!(!decisions.is_empty() && decisions.iter().all(|e| e["type"] == "decision"));
    assert_eq!(decisions.len(), all.iter().filter(|e| e["type"] == "decision").count());
    let t001 = lines(&p.run(&["events", "--json", "--code", "T001"]));
    assert_eq!(t001.len(), 1, "{t001:?}");
    assert_eq!(t001[0]["iteration"], 1);
    let full = lines(&p.run(&["events", "--json", "--code", "L003_SCORER_POLICY_MISMATCH"]));
    assert_eq!(full.len(), 1);
    let off = lines(&p.run(&["events", "--json", "--node", "grpo@guard=off"]));
    assert!(!off.is_empty() && off.iter().all(|e| e["node"] == "grpo@guard=off"));
    let base = lines(&p.run(&["events", "--json", "--node", "grpo"]));
    assert!(base.len() > off.len() && base.iter().all(|e| e["node"].as_str().unwrap().starts_with("grpo@")));
    let none = p.run(&["events", "--run", "no-such-run"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(stderr(&none).contains("no run 'no-such-run'"), "{}", stderr(&none));

    // The webhook sees exactly the non-ALLOW decisions, after a retried 503.
    let (url, bodies) = server(vec![503]);
    let out = p.run(&["alert-scan", "--webhook", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut got: Vec<(String, u64, Value)> = bodies
        .lock()
        .unwrap()
        .iter()
        .map(|b| (b["node"].as_str().unwrap().to_string(), b["iteration"].as_u64().unwrap(), b["codes"].clone()))
        .collect();
    got.sort_by_key(|g| g.1);
    refused.sort_by_key(|g| g.1);
    assert_eq!(got, refused);

    // Slack-compatible payload.
    let (url, bodies) = server(vec![]);
    assert_eq!(p.run(&["alert-scan", "--webhook", &url, "--slack"]).status.code(), Some(0));
    let b = bodies.lock().unwrap();
    assert_eq!(b.len(), 2);
    assert!(b.iter().all(|m| m["text"].as_str().unwrap().contains("REJECT")));

    // A guard log edited to turn a refused batch into an allowed one is an
    // error naming the edit, for `events` and `alert-scan` alike: neither
    // reports the edited chain as if it were the one the run sealed (alert-scan
    // posted no alert at all for it).
    let ledger = rusqlite::Connection::open(p.path().join(".orchestrate/guard.sqlite")).unwrap();
    let edited = ledger
        .execute(
            "UPDATE guard_events SET payload = replace(payload, '\"decision\":\"reject\"', '\"decision\":\"allow\"') \
             WHERE kind = 'decision' AND payload LIKE '%reject%'",
            [],
        )
        .unwrap();
    assert_eq!(edited, 2, "the two refused batches");
    drop(ledger);
    for args in [vec!["events"], vec!["alert-scan", "--webhook", "http://127.0.0.1:9/hook", "--dry-run"]] {
        let out = p.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}{}", stdout(&out), stderr(&out));
        assert!(stderr(&out).contains("was edited"), "{args:?}: {}", stderr(&out));
        assert!(!stdout(&out).contains("REJECT") && !stdout(&out).contains("reject"), "{}", stdout(&out));
    }
    let ledger = rusqlite::Connection::open(p.path().join(".orchestrate/guard.sqlite")).unwrap();
    ledger
        .execute(
            "UPDATE guard_events SET payload = replace(payload, '\"decision\":\"allow\",\"iteration\"', '\"decision\":\"reject\",\"iteration\"') \
             WHERE kind = 'decision' AND payload LIKE '%codes%'",
            [],
        )
        .unwrap();
    drop(ledger);
    assert_eq!(p.run(&["events"]).status.code(), Some(0), "the chain verifies again once restored");

    // An endpoint that keeps failing is a clear error.
    let (url, _) = server(vec![500; 10]);
    let out = p.run(&["alert-scan", "--webhook", &url, "--retries", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(&url) && stderr(&out).contains("HTTP 500"), "{}", stderr(&out));

    // A server that accepts and never answers is cut after the total timeout,
    // retries included, and the error says so.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || silent.incoming().take(8).flatten().collect::<Vec<_>>());
    let started = std::time::Instant::now();
    let out = p.run(&["alert-scan", "--webhook", &url, "--timeout", "2"]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(took < std::time::Duration::from_secs(6), "cut after {took:?}");
    assert!(stderr(&out).contains("2 s"), "{}", stderr(&out));
    drop(held);
}

#[test]
fn a_webhook_that_is_not_an_http_url_is_a_usage_error_at_once() {
    let p = Project::new();
    for (url, expected) in [
        ("notaurl", "expected an http:// or https:// URL"),
        ("file:///etc/passwd", "expected an http:// or https:// URL"),
        ("http://127.0.0.1:99999/hook", "port 99999 is out of range (1-65535)"),
        ("http:///hook", "has no host"),
    ] {
        let started = std::time::Instant::now();
        let out = p.run(&["alert-scan", "--webhook", url]);
        assert_eq!(out.status.code(), Some(2), "{url}");
        let err = stderr(&out);
        assert!(err.contains(url) && err.contains(expected), "{url}: {err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{url}: failed at once, no retries");
    }
}
