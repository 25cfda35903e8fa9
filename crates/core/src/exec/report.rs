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
    // Ids, reasons and errors (a failed command's last log lines) are shown
    // escaped: a CR or an ESC sequence from them must never rewrite a line.
    use crate::ids::{escaped as e, escaped_lines as el};
    Some(match event {
        Event::RunStarted { run_id, spec, nodes, jobs } => {
            format!("run {run_id}: {}, {nodes} nodes, {jobs} jobs", e(spec))
        }
        Event::NodeStarted { node, key, reason } => {
            format!("running  {} {} ({})", e(node), short(key), el(reason))
        }
        Event::CacheHit { node, key, restored: Some(what), moved, .. } => {
            let moved: String = moved.iter().map(|m| format!("; {}", e(&m.to_string()))).collect();
            format!("restored {} {} ({} checked out of the store{moved})", e(node), short(key), e(what))
        }
        Event::CacheHit { node, key, from: None, .. } => format!("cached   {} {}", e(node), short(key)),
        Event::CacheHit { node, key, from: Some(remote), .. } => {
            format!("cached   {} {} (from {})", e(node), short(key), e(remote))
        }
        Event::Waiting { node, reason, .. } => format!("waiting  {}: {}", e(node), el(reason)),
        Event::NodeFinished { node, key, seconds, summary: None } => {
            format!("done     {} {} in {seconds:.2}s", e(node), short(key))
        }
        Event::NodeFinished { node, key, seconds, summary: Some(summary) } => {
            format!("done     {} {} in {seconds:.2}s: {summary}", e(node), short(key))
        }
        Event::NodeFailed { node, key, error, .. } => {
            format!("FAILED   {} {}: {}", e(node), key.as_deref().map(short).unwrap_or("-"), el(error))
        }
        Event::NodeSkipped { node, because } => format!("skipped  {}: {}", e(node), el(because)),
        Event::RunFinished { ran, cached, failed, skipped, seconds, .. } => {
            format!("{ran} ran, {cached} cached, {failed} failed, {skipped} skipped in {seconds:.2}s")
        }
        Event::PackFrozen { pack, root, .. } => format!("frozen   {}: root digest {root}", e(pack)),
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
            // A closed stream (`| head -1`) must never stop the run: what
            // cannot be written is dropped; the events are kept in the index.
            let _ = if failed {
                writeln!(std::io::stderr().lock(), "{line}")
            } else {
                writeln!(std::io::stdout().lock(), "{line}")
            };
        }
    }
}

/// An overall bar plus a spinner per running node with its key prefix (TTYs).
pub struct ProgressReporter {
    multi: MultiProgress,
    overall: ProgressBar,
    running: HashMap<String, ProgressBar>,
    /// The workspace's `logs/` folder, tailed for progress lines of running nodes.
    logs: Option<std::path::PathBuf>,
}

/// A line a node's log starts with this prefix is its live progress (the GRPO
/// iteration, mean reward and KL; the SFT epoch and validation NLL), shown on the
/// node's spinner while it runs.
pub const PROGRESS_PREFIX: &str = "progress: ";

/// The last complete progress line in `text`, if any.
pub fn last_progress(text: &str) -> Option<&str> {
    text.lines().rev().find_map(|l| l.strip_prefix(PROGRESS_PREFIX)).map(str::trim)
}

/// The longest line a log's tail keeps while waiting for its end: a longer
/// one is no progress line, and is dropped.
const MAX_TAIL_LINE: usize = 64 << 10;

/// What a node's log gained since the last look: only the new bytes are read
/// (a log read whole at each look made following a log that grows to
/// gigabytes quadratic), and of a long stretch only its last
/// 2 × [`MAX_TAIL_LINE`] bytes (only the last complete progress line matters).
#[derive(Default)]
struct LogTail {
    /// Bytes of the log already looked at.
    seen: u64,
    /// The unfinished last line, kept for the next look.
    partial: Vec<u8>,
    /// The bytes that follow continue a line not kept (skipped into, or too
    /// long): they are dropped up to its end.
    mid_line: bool,
}

impl LogTail {
    /// The last complete progress line the log gained, if any.
    fn look(&mut self, log: &std::path::Path) -> Option<String> {
        use std::io::{Read, Seek};
        let mut file = std::fs::File::open(log).ok()?;
        let len = file.metadata().ok()?.len();
        if len < self.seen {
            // The log was truncated (a fresh attempt): start over.
            *self = LogTail::default();
        }
        if len == self.seen {
            return None;
        }
        // Of a long stretch, only its end can hold the last progress line.
        let from = self.seen.max(len.saturating_sub(2 * MAX_TAIL_LINE as u64));
        file.seek(std::io::SeekFrom::Start(from)).ok()?;
        let mut new = Vec::new();
        file.take(len - from).read_to_end(&mut new).ok()?;
        if from > self.seen {
            // Skipped into the middle of a line.
            self.partial.clear();
            self.mid_line = true;
        }
        self.seen = from + new.len() as u64;
        if self.mid_line {
            match new.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    new.drain(..=i);
                    self.mid_line = false;
                }
                None => new.clear(),
            }
        }
        self.partial.extend_from_slice(&new);
        let complete = self.partial.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let line = last_progress(&String::from_utf8_lossy(&self.partial[..complete])).map(str::to_string);
        self.partial.drain(..complete);
        if self.partial.len() > MAX_TAIL_LINE {
            self.partial.clear();
            self.mid_line = true;
        }
        line
    }
}

/// Follows a node's log while its bar is not finished, showing its last progress
/// line after the node's own message.
fn follow(log: std::path::PathBuf, bar: ProgressBar, base: String) {
    std::thread::spawn(move || {
        let mut tail = LogTail::default();
        while !bar.is_finished() {
            std::thread::sleep(Duration::from_millis(250));
            if let Some(p) = tail.look(&log) {
                bar.set_message(format!("{base} - {}", crate::ids::escaped(&p)));
            }
        }
    });
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
        ProgressReporter { multi, overall, running: HashMap::new(), logs: None }
    }

    fn resolved(&mut self, node: &str) {
        if let Some(bar) = self.running.remove(node) {
            bar.finish_and_clear();
            self.multi.remove(&bar);
        }
        self.overall.inc(1);
    }
}

impl ProgressReporter {
    /// Shows each running node's progress lines from its log in `logs`.
    pub fn following(mut self, logs: std::path::PathBuf) -> Self {
        self.logs = Some(logs);
        self
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
                let base = format!("{} {} ({})", crate::ids::escaped(node), short(key), crate::ids::escaped(reason));
                bar.set_message(base.clone());
                bar.enable_steady_tick(Duration::from_millis(120));
                if let Some(logs) = &self.logs {
                    follow(logs.join(format!("{key}.log")), bar.clone(), base);
                }
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
                    let _ = writeln!(std::io::stdout().lock(), "{line}");
                }
            }
            Event::PackFrozen { .. } => {}
        }
    }
    fn finish(&mut self) {
        for (_, bar) in self.running.drain() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn the_last_progress_line_wins_and_other_lines_are_ignored() {
        let log = "loading\nprogress: iteration 1/3  mean reward 0.000  KL -\ngrpo iteration 1: ...\nprogress: iteration 2/3  mean reward 0.250  KL 1.20e-3\nwarning: x\n";
        assert_eq!(last_progress(log), Some("iteration 2/3  mean reward 0.250  KL 1.20e-3"));
        assert_eq!(last_progress("no progress here\n"), None);
    }

    /// A log is read from where the last look stopped: a 64 MiB stretch
    /// costs one read of its end, a line split across looks (a multi-byte
    /// character too) is whole when shown, a line longer than the tail keeps
    /// is dropped, and a truncated log (a new attempt) is read from its start.
    #[test]
    fn a_logs_tail_reads_what_it_gained_and_keeps_a_bounded_line() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("k.log");
        let mut file = std::fs::File::create(&log).unwrap();
        let mut tail = LogTail::default();
        assert_eq!(tail.look(&log), None);
        write!(file, "starting\nprogress: iteration 1/2  r\u{e9}").unwrap();
        file.flush().unwrap();
        assert_eq!(tail.look(&log), None, "a half-written line is not shown");
        writeln!(file, "ward 0.5").unwrap();
        assert_eq!(tail.look(&log).as_deref(), Some("iteration 1/2  r\u{e9}ward 0.5"));

        // 64 MiB of other output, then a progress line: one look reads the end only.
        let noise = vec![b'x'; 1 << 20];
        for _ in 0..64 {
            file.write_all(&noise).unwrap();
        }
        write!(file, "\nprogress: iteration 2/2\n").unwrap();
        let before = tail.seen;
        assert_eq!(tail.look(&log).as_deref(), Some("iteration 2/2"));
        assert_eq!(tail.seen, std::fs::metadata(&log).unwrap().len());
        assert!(tail.seen - before > (64 << 20), "the look skipped the stretch");
        assert!(tail.partial.is_empty());

        // A line longer than the tail keeps never grows it past its bound,
        // and its rest is not taken for a line of its own.
        for _ in 0..4 {
            file.write_all(&noise[..MAX_TAIL_LINE]).unwrap();
            assert_eq!(tail.look(&log), None);
            assert!(tail.partial.len() <= MAX_TAIL_LINE, "{}", tail.partial.len());
        }
        writeln!(file, "progress: the long line's end").unwrap();
        assert_eq!(tail.look(&log), None, "the end of a line too long to keep is no line");
        writeln!(file, "progress: iteration 3/3").unwrap();
        assert_eq!(tail.look(&log).as_deref(), Some("iteration 3/3"));
        writeln!(file, "{}progress: in a long line", "y".repeat(2 * MAX_TAIL_LINE)).unwrap();
        assert_eq!(tail.look(&log), None, "the end of a line skipped into is no line");

        // A new attempt truncates the log: read from its start.
        std::fs::write(&log, "progress: attempt 2\n").unwrap();
        assert_eq!(tail.look(&log).as_deref(), Some("attempt 2"));
    }

    #[test]
    fn a_running_bar_shows_the_progress_its_log_gains() {
        let dir = std::env::temp_dir().join(format!("orchestrate-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("k.log");
        std::fs::write(&log, "starting\n").unwrap();
        let bar = ProgressBar::hidden();
        follow(log.clone(), bar.clone(), "grpo 1234".into());
        std::fs::write(&log, "starting\nprogress: iteration 1/2  mean reward 0.500  KL 3.00e-4\nprogress: iter")
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while bar.message() == "" && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // The half-written line is not shown.
        assert_eq!(bar.message(), "grpo 1234 - iteration 1/2  mean reward 0.500  KL 3.00e-4");
        bar.finish_and_clear();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
