//! `orchestrate events` (search a run's engine events and its GRPO nodes' sealed
//! guard events) and `orchestrate alert-scan` (POST every non-ALLOW decision).

use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::commands::Ctx;
use super::exit::Status;
use super::{AlertScanArgs, EventsArgs};
use serde::Serialize;
use serde_json::Value;
use std::io::Write as _;

use orchestrate_core::exec::run_events::{self, Alert, Detail, RunEvent};
use orchestrate_core::exec::Event;
use orchestrate_core::store::Workspace;

/// Every event of a run (`exec::run_events::collect`).
pub fn collect(ws: &Workspace, run: &str) -> Result<Vec<RunEvent>> {
    Ok(run_events::collect(ws, run)?)
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
    pub fn matches(&self, e: &RunEvent) -> bool {
        if self.kind.as_ref().is_some_and(|k| &e.kind != k) {
            return false;
        }
        if let Some(c) = &self.code {
            let has = e
                .codes
                .iter()
                .any(|x| x.eq_ignore_ascii_case(c) || x.split('_').next().is_some_and(|id| id.eq_ignore_ascii_case(c)));
            if !has {
                return false;
            }
        }
        if let Some(n) = &self.node {
            let node = e.node.as_deref().unwrap_or_default();
            if node != n && node.split('@').next() != Some(n.as_str()) {
                return false;
            }
        }
        true
    }
}

/// One line per event for people.
pub fn render(e: &RunEvent) -> String {
    let node = e.node.as_deref().unwrap_or("-");
    let kind = &e.kind;
    match &e.detail {
        Detail::Guard { producer, decision, iteration, .. } => {
            let mut line = format!("guard  {node}  #{} {producer}/{kind}  iteration {iteration}", e.seq);
            if let Some(d) = decision {
                line.push_str(&format!("  {}", d.as_str().to_uppercase()));
            }
            if !e.codes.is_empty() {
                line.push_str(&format!("  {}", e.codes.join(", ")));
            }
            line
        }
        Detail::Engine { event } => {
            let mut line = format!("engine {node}  #{} {kind}", e.seq);
            // How long it took; why it ran (under Slurm: which job), why it waited, or why it failed.
            let (seconds, why) = match event {
                Event::NodeStarted { reason, .. } | Event::Waiting { reason, .. } => (None, Some(reason)),
                Event::NodeFinished { seconds, .. } | Event::RunFinished { seconds, .. } => (Some(*seconds), None),
                Event::NodeFailed { seconds, error, .. } => (Some(*seconds), Some(error)),
                Event::NodeSkipped { because, .. } => (None, Some(because)),
                Event::RunStarted { .. } | Event::CacheHit { .. } | Event::PackFrozen { .. } => (None, None),
            };
            if let Some(s) = seconds {
                line.push_str(&format!("  {s:.2}s"));
            }
            if let Some(text) = why {
                line.push_str(&format!("  {text}"));
            }
            line
        }
    }
}

/// The guard decisions of a run that were not ALLOW.
pub fn alerts(events: &[RunEvent]) -> Vec<Alert> {
    events.iter().filter_map(RunEvent::alert).collect()
}

/// A Slack-compatible message: `text`, with the full alert under `orchestrate`.
#[derive(Debug, Serialize)]
struct SlackMessage<'a> {
    text: String,
    orchestrate: &'a Alert,
}

/// The JSON body posted for one alert; `slack` wraps it in a Slack-compatible
/// `{"text": ...}` message (the full alert rides along under `orchestrate`).
pub fn payload(alert: &Alert, slack: bool) -> Value {
    let body = if slack {
        serde_json::to_value(SlackMessage {
            text: format!(
                ":rotating_light: orchestrate guard {} in run {}, node {}, iteration {}: {}",
                alert.decision.as_str().to_uppercase(),
                alert.run,
                alert.node,
                alert.iteration,
                alert.codes.join(", ")
            ),
            orchestrate: alert,
        })
    } else {
        serde_json::to_value(alert)
    };
    body.expect("an alert serializes")
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
        let line = if json { serde_json::to_string(e)? } else { render(e) };
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
