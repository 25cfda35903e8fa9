//! `orchestrate events` (search a run's engine events and its GRPO nodes' sealed
//! guard events) and `orchestrate alert-scan` (POST every non-ALLOW decision).

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::{AlertScanArgs, EventsArgs};
use serde_json::{json, Value};
use std::io::Write as _;

use orchestrate_core::dag::key::HashInputs;
use orchestrate_core::exec::Event;
use orchestrate_core::ops::worker::WorkerOp;
use orchestrate_core::store::Workspace;
use orchestrate_core::train::metrics::TrainingMetrics;

/// Every event of a run, engine events first (in order), then, for each node of
/// the run that has GRPO metrics, its guard event chain. Each event is
/// `{source, node, type, seq, codes, ...}`.
pub fn collect(ws: &Workspace, run: &str) -> Result<Vec<Value>> {
    let index = ws.index()?;
    let mut out = Vec::new();
    for (seq, text) in index.run_events(run)?.iter().enumerate() {
        let e: Event =
            serde_json::from_str(text).with_context(|| format!("event {seq} of run {run} is not an engine event"))?;
        out.push(json!({
            "source": "engine", "run": run, "seq": seq, "type": e.kind(), "node": e.node(),
            "codes": [], "event": e,
        }));
    }
    let ledger = orchestrate_core::guard::Ledger::open_read_only(ws)?;
    for n in index.run_nodes(run)? {
        let Some(ledger) = &ledger else { break };
        let Some(key) = &n.key else { continue };
        let Some(cached) = index.lookup(key)? else { continue };
        // GRPO nodes have a guard lineage; their metrics say which.
        if HashInputs::from_stored(&cached.record)?.op != WorkerOp::TrainGrpo.name() {
            continue;
        }
        let metrics = cached
            .outputs
            .iter()
            .find(|o| o.name == "metrics")
            .with_context(|| format!("GRPO node {} has no metrics output", n.node_id))?;
        let TrainingMetrics::Grpo(m) = TrainingMetrics::read(&ws.object_path(&metrics.object.hash))? else {
            bail!("the metrics of GRPO node {} are not GRPO metrics", n.node_id);
        };
        let lineage = m.lineage.as_str();
        for orchestrate_core::guard::ledger::StoredEvent { seq, producer, kind, payload, seal, .. } in
            ledger.events(lineage)?
        {
            let payload: Value = serde_json::from_str(&payload).unwrap_or(Value::String(payload));
            let codes = payload["codes"].clone();
            out.push(json!({
                "source": "guard", "run": run, "seq": seq, "type": kind, "node": n.node_id,
                "producer": producer, "lineage": lineage, "seal": seal,
                "codes": if codes.is_array() { codes } else { json!([]) },
                "decision": payload["decision"], "iteration": payload["iteration"], "payload": payload,
            }));
        }
    }
    Ok(out)
}

/// Filters for `orchestrate events`.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    /// The event type (`node_finished`, `decision`, `update_applied`, ...).
    pub kind: Option<String>,
    /// A reason code, in full (`T001_ARTIFACT_HASH_MISMATCH`) or by its id (`T001`).
    pub code: Option<String>,
    /// A node id, or a matrix node's base id (`grpo` matches `grpo@mode=continuous`).
    pub node: Option<String>,
}

impl Filter {
    pub fn matches(&self, e: &Value) -> bool {
        if let Some(k) = &self.kind {
            if e["type"].as_str() != Some(k.as_str()) {
                return false;
            }
        }
        if let Some(c) = &self.code {
            let has =
                e["codes"].as_array().into_iter().flatten().filter_map(Value::as_str).any(|x| {
                    x.eq_ignore_ascii_case(c) || x.split('_').next().is_some_and(|id| id.eq_ignore_ascii_case(c))
                });
            if !has {
                return false;
            }
        }
        if let Some(n) = &self.node {
            let node = e["node"].as_str().unwrap_or_default();
            if node != n && node.split('@').next() != Some(n.as_str()) {
                return false;
            }
        }
        true
    }
}

/// One line per event for people.
pub fn render(e: &Value) -> String {
    let node = e["node"].as_str().unwrap_or("-");
    let kind = e["type"].as_str().unwrap_or("?");
    match e["source"].as_str() {
        Some("guard") => {
            let codes: Vec<&str> = e["codes"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let mut line = format!("guard  {node}  #{} {}/{kind}", e["seq"], e["producer"].as_str().unwrap_or("?"));
            if let Some(i) = e["iteration"].as_u64() {
                line.push_str(&format!("  iteration {i}"));
            }
            if let Some(d) = e["decision"].as_str() {
                line.push_str(&format!("  {}", d.to_uppercase()));
            }
            if !codes.is_empty() {
                line.push_str(&format!("  {}", codes.join(", ")));
            }
            line
        }
        _ => {
            let mut line = format!("engine {node}  #{} {kind}", e["seq"]);
            if let Some(s) = e["event"]["seconds"].as_f64() {
                line.push_str(&format!("  {s:.2}s"));
            }
            // Why it ran (under Slurm: which job), why it waited, or why it failed.
            for field in ["reason", "because", "error"] {
                if let Some(text) = e["event"][field].as_str() {
                    line.push_str(&format!("  {text}"));
                }
            }
            line
        }
    }
}

/// The guard decisions of a run that were not ALLOW.
pub fn alerts(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["source"] == "guard" && e["type"] == "decision")
        .filter(|e| e["decision"].as_str().is_some_and(|d| !d.eq_ignore_ascii_case("allow")))
        .cloned()
        .collect()
}

/// The JSON body posted for one alert; `slack` wraps it in a Slack-compatible
/// `{"text": ...}` message (the full alert rides along under `orchestrate`).
pub fn payload(alert: &Value, slack: bool) -> Value {
    let body = json!({
        "run": alert["run"], "node": alert["node"], "iteration": alert["iteration"],
        "decision": alert["decision"], "codes": alert["codes"], "lineage": alert["lineage"],
        "seq": alert["seq"], "seal": alert["seal"],
    });
    if !slack {
        return body;
    }
    let codes: Vec<&str> = alert["codes"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    json!({
        "text": format!(
            ":rotating_light: orchestrate guard {} in run {}, node {}, iteration {}: {}",
            alert["decision"].as_str().unwrap_or("?").to_uppercase(),
            alert["run"].as_str().unwrap_or("?"),
            alert["node"].as_str().unwrap_or("?"),
            alert["iteration"],
            codes.join(", ")
        ),
        "orchestrate": body,
    })
}

/// `--webhook`: an absolute http:// or https:// URL with a host and, if given,
/// a port in 1-65535. Anything else is a usage error before anything is sent.
pub fn parse_webhook(url: &str) -> std::result::Result<String, String> {
    let rest = ["http://", "https://"]
        .iter()
        .find_map(|scheme| {
            url.get(..scheme.len()).filter(|p| p.eq_ignore_ascii_case(scheme)).map(|_| &url[scheme.len()..])
        })
        .ok_or_else(|| format!("'{url}': expected an http:// or https:// URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        // An IPv6 literal: [::1]:8080
        Some(v6) => match v6.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => return Err(format!("'{url}': an unclosed IPv6 address")),
        },
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    if let Some(port) = port {
        match port.parse::<u32>() {
            Ok(n) if (1..=65535).contains(&n) => {}
            Ok(_) => return Err(format!("'{url}': port {port} is out of range (1-65535)")),
            Err(_) => return Err(format!("'{url}': port '{port}' is not a number")),
        }
    }
    url.parse::<ureq::http::Uri>().map_err(|e| format!("'{url}' is not a valid URL: {e}"))?;
    Ok(url.to_string())
}

/// POSTs `body` to `url`, retrying transport errors and 5xx/429 answers with
/// exponential backoff; a 4xx answer is not retried. The whole, retries and
/// waits included, takes at most `total`: a server that never answers is cut.
pub fn post(url: &str, body: &Value, retries: u32, backoff: Duration, total: Duration) -> Result<()> {
    let started = std::time::Instant::now();
    let mut last = String::new();
    for attempt in 0..=retries {
        if attempt > 0 {
            let wait = backoff * 2u32.pow(attempt - 1);
            if started.elapsed() + wait >= total {
                break;
            }
            std::thread::sleep(wait);
        }
        let left = total.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        let agent: ureq::Agent =
            ureq::Agent::config_builder().timeout_global(Some(left)).http_status_as_error(false).build().into();
        match agent.post(url).header("content-type", "application/json").send(body.to_string()) {
            Ok(resp) => {
                let status = resp.status().as_u16();
                if (200..300).contains(&status) {
                    return Ok(());
                }
                last = format!("HTTP {status}");
                if status != 429 && status < 500 {
                    break;
                }
            }
            Err(e) => last = e.to_string(),
        }
    }
    if started.elapsed() >= total || last.is_empty() {
        bail!("webhook {url}: no answer within {} s (--timeout), retries included: {last}", total.as_secs())
    }
    bail!("webhook {url} failed after {} attempt(s): {last}", retries + 1)
}

/// `orchestrate events`: a run's events, filtered.
pub fn events(ctx: &Ctx, args: EventsArgs) -> Result<Status> {
    let EventsArgs { run, kind, code, node, json } = args;
    let ws = Workspace::open_read_only(&ctx.workspace)?
        .with_context(|| format!("no workspace at {}", ctx.workspace.display()))?;
    let run = ws.resolve_run(run)?;
    let filter = Filter { kind, code, node };
    let mut shown = 0usize;
    let mut out = std::io::stdout().lock();
    for e in collect(&ws, &run)?.iter().filter(|e| filter.matches(e)) {
        shown += 1;
        let line = if json { e.to_string() } else { render(e) };
        // A reader that went away (`| head`) ends the listing quietly.
        if writeln!(out, "{line}").is_err() {
            return Ok(Status::Ok);
        }
    }
    if !json {
        eprintln!("{shown} event(s) of run {run}");
    }
    Ok(Status::Ok)
}

/// `orchestrate alert-scan`: every non-ALLOW guard decision to a webhook.
pub fn alert_scan(ctx: &Ctx, args: AlertScanArgs) -> Result<Status> {
    let AlertScanArgs { run, webhook, slack, retries, timeout, dry_run } = args;
    let ws = Workspace::open_read_only(&ctx.workspace)?
        .with_context(|| format!("no workspace at {}", ctx.workspace.display()))?;
    let run = ws.resolve_run(run)?;
    let alerts = alerts(&collect(&ws, &run)?);
    for a in &alerts {
        let body = payload(a, slack);
        if dry_run {
            outln!("{body}");
        } else {
            let deadline = std::time::Duration::from_secs(timeout);
            post(&webhook, &body, retries, std::time::Duration::from_millis(200), deadline)?;
        }
    }
    eprintln!(
        "{} non-ALLOW decision(s) in run {run}{}",
        alerts.len(),
        if dry_run { " (dry run, nothing posted)" } else { "" }
    );
    Ok(Status::Ok)
}
