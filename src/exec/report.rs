//! Reporters turn events into output: JSON lines, plain lines, or progress bars.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::events::Event;

/// Consumes the events of a run.
pub trait Reporter {
    fn on_event(&mut self, event: &Event);
    fn finish(&mut self) {}
}

fn short(key: &str) -> &str {
    &key[..key.len().min(8)]
}

/// One JSON object per line on stdout (`--json`).
pub struct JsonReporter;

impl Reporter for JsonReporter {
    fn on_event(&mut self, event: &Event) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", event.to_json());
    }
}

/// Plain lines, for logs and pipes; `quiet` keeps only failures and the summary.
pub struct PlainReporter {
    pub quiet: bool,
}

/// The one-line rendering of an event shared by the plain and progress reporters.
pub fn describe(event: &Event) -> Option<String> {
    Some(match event {
        Event::RunStarted { run_id, spec, nodes, jobs } => format!("run {run_id}: {spec}, {nodes} nodes, {jobs} jobs"),
        Event::NodeStarted { node, key, reason } => {
            format!("running  {node} {} ({reason})", short(key))
        }
        Event::CacheHit { node, key } => format!("cached   {node} {}", short(key)),
        Event::Waiting { node, reason, .. } => format!("waiting  {node}: {reason}"),
        Event::NodeFinished { node, key, seconds } => {
            format!("done     {node} {} in {seconds:.2}s", short(key))
        }
        Event::NodeFailed { node, key, error, .. } => {
            format!("FAILED   {node} {}: {error}", key.as_deref().map(short).unwrap_or("-"))
        }
        Event::NodeSkipped { node, because } => format!("skipped  {node}: {because}"),
        Event::RunFinished { ran, cached, failed, skipped, seconds, .. } => {
            format!("{ran} ran, {cached} cached, {failed} failed, {skipped} skipped in {seconds:.2}s")
        }
    })
}

impl Reporter for PlainReporter {
    fn on_event(&mut self, event: &Event) {
        let important =
            matches!(event, Event::NodeFailed { .. } | Event::NodeSkipped { .. } | Event::RunFinished { .. });
        if self.quiet && !important {
            return;
        }
        if let Some(line) = describe(event) {
            let failed = matches!(event, Event::NodeFailed { .. });
            if failed {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        }
    }
}

/// An overall bar plus a spinner per running node with its key prefix (TTYs).
pub struct ProgressReporter {
    multi: MultiProgress,
    overall: ProgressBar,
    running: HashMap<String, ProgressBar>,
}

impl ProgressReporter {
    pub fn new() -> Self {
        let multi = MultiProgress::new();
        let overall = multi.add(ProgressBar::new(0));
        overall.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} nodes {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        ProgressReporter { multi, overall, running: HashMap::new() }
    }

    fn resolved(&mut self, node: &str) {
        if let Some(bar) = self.running.remove(node) {
            bar.finish_and_clear();
            self.multi.remove(&bar);
        }
        self.overall.inc(1);
    }
}

impl Default for ProgressReporter {
    fn default() -> Self {
        Self::new()
    }
}

impl Reporter for ProgressReporter {
    fn on_event(&mut self, event: &Event) {
        match event {
            Event::RunStarted { nodes, .. } => {
                self.overall.set_length(*nodes as u64);
                self.overall.enable_steady_tick(Duration::from_millis(250));
            }
            Event::NodeStarted { node, key, reason } => {
                let bar = self.multi.add(ProgressBar::new_spinner());
                bar.set_style(ProgressStyle::with_template("  {spinner} {msg} {elapsed}").expect("valid template"));
                bar.set_message(format!("{node} {} ({reason})", short(key)));
                bar.enable_steady_tick(Duration::from_millis(120));
                self.running.insert(node.clone(), bar);
            }
            Event::Waiting { .. } => {
                if let Some(line) = describe(event) {
                    let _ = self.multi.println(line);
                }
            }
            Event::CacheHit { node, .. } => self.resolved(node),
            Event::NodeFinished { node, .. } => {
                if let Some(line) = describe(event) {
                    let _ = self.multi.println(line);
                }
                self.resolved(node);
            }
            Event::NodeFailed { node, .. } | Event::NodeSkipped { node, .. } => {
                if let Some(line) = describe(event) {
                    let _ = self.multi.println(line);
                }
                self.resolved(node);
            }
            Event::RunFinished { .. } => {
                self.overall.finish_and_clear();
                if let Some(line) = describe(event) {
                    println!("{line}");
                }
            }
        }
    }
    fn finish(&mut self) {
        for (_, bar) in self.running.drain() {
            bar.finish_and_clear();
        }
    }
}
