//! Running a child process for an op: in a process group of its own that dies
//! with the node (on success, failure, cancel, an error or panic here) and
//! with orchestrate itself, even when orchestrate is SIGKILLed. Cancellable,
//! logged.
//!
//! A node's command may start processes of its own (`cmd &`, a data loader's
//! workers). They share the node's process group, so the whole group is
//! killed: when the node's main process exits (what it left running would
//! otherwise keep writing into the tree), when the run is cancelled, and, if
//! orchestrate dies without a chance to do it, by a watchdog. The watchdog is a
//! small `sh` holding the read end of a pipe whose only write end is
//! orchestrate's: when orchestrate dies, however it dies, the kernel closes
//! that end and the watchdog, reading end-of-file where it waited for "done",
//! kills the group. (A process that leaves the group on purpose, with
//! `setsid`, escapes this, as it escapes a terminal's Ctrl-C.)
//!
//! What the child writes (stdout and stderr) goes to the node's log through
//! orchestrate, which keeps its last bytes in memory too: when the log cannot
//! be written (a full disk), the reason the node failed is still in its error,
//! and is written to the log once there is room again.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::OpError;

/// The watchdog: reads the group id, then waits for "done"; end-of-file
/// instead means orchestrate is gone, and the group is killed. It ignores the
/// terminal's signals so that only its pipe decides.
const WATCHDOG: &str = r#"trap '' HUP INT TERM
read -r g || exit 0
if read -r _; then exit 0; fi
[ -n "$g" ] && kill -s KILL -- "-$g" 2>/dev/null
exit 0"#;

/// How much of a child's output is kept in memory (the end of it).
const TAIL_BYTES: usize = 16 << 10;

/// Where a child's output goes: its log file, and the last [`TAIL_BYTES`].
struct Sink {
    file: std::fs::File,
    tail: Vec<u8>,
    /// The first error writing the log; after it nothing more is written there.
    error: Option<std::io::Error>,
}

impl Sink {
    fn take(&mut self, chunk: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.file.write_all(chunk) {
                self.error = Some(e);
            }
        }
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
    }
}

/// The threads that copy a child's stdout and stderr into its [`Sink`].
struct Capture {
    sink: Arc<Mutex<Sink>>,
    log: PathBuf,
    done: mpsc::Receiver<()>,
    streams: usize,
}

impl Capture {
    fn start(child: &mut Child, log: &Path, file: std::fs::File) -> Capture {
        let sink = Arc::new(Mutex::new(Sink { file, tail: Vec::new(), error: None }));
        let (tx, done) = mpsc::channel();
        let mut streams = 0;
        let readers: Vec<Box<dyn Read + Send>> = [
            child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>),
            child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        .collect();
        for mut reader in readers {
            streams += 1;
            let (sink, tx) = (sink.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 8192];
                loop {
                    match reader.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => sink.lock().unwrap_or_else(|p| p.into_inner()).take(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    }
                }
                let _ = tx.send(());
            });
        }
        Capture { sink, log: log.to_path_buf(), done, streams }
    }

    /// Waits for the streams to end (at most 2 s: a process that left the
    /// group with `setsid` may hold them open), then says what was captured.
    fn finish(self) -> Output {
        let until = std::time::Instant::now() + Duration::from_secs(2);
        for _ in 0..self.streams {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if self.done.recv_timeout(left).is_err() {
                break;
            }
        }
        let sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        Output { tail: sink.tail.clone(), log: self.log, log_error: sink.error.as_ref().map(|e| e.to_string()) }
    }
}

/// What a child wrote: the end of it, and whether its log holds all of it.
#[derive(Debug, Clone)]
pub struct Output {
    tail: Vec<u8>,
    log: PathBuf,
    log_error: Option<String>,
}

impl Output {
    /// `; last lines of LOG:` and the last `n` lines the child wrote (from
    /// memory, so a log that could not be written does not lose them), for
    /// an error message; empty when it wrote nothing.
    pub fn last_lines(&self, n: usize) -> String {
        let text = String::from_utf8_lossy(&self.tail);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            return match &self.log_error {
                Some(e) => format!("; its log {} could not be written: {e}", self.log.display()),
                None => String::new(),
            };
        }
        let last = &lines[lines.len().saturating_sub(n)..];
        let incomplete = match &self.log_error {
            Some(e) => format!(" (its log could not be written: {e})"),
            None => String::new(),
        };
        format!("; last lines of {}{incomplete}:\n  {}", self.log.display(), last.join("\n  "))
    }

    /// If writing the log failed, appends what memory kept (best effort: the
    /// disk may still be full). Call it after freeing what the node left.
    pub fn complete_log(&self) {
        let Some(e) = &self.log_error else { return };
        if let Ok(mut f) = crate::store::fsx::open_append(&self.log) {
            let _ = write!(
                f,
                "\n[orchestrate] this log is incomplete: writing it failed ({e}); the last {} bytes the node wrote, kept in memory:\n",
                self.tail.len()
            );
            let _ = f.write_all(&self.tail);
        }
    }
}

/// How a tied child ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub output: Output,
}

/// A running child process in its own group, tied to this process.
pub struct Tied {
    child: Child,
    pgid: libc::pid_t,
    watchdog: Option<(Child, std::io::PipeWriter)>,
    capture: Option<Capture>,
    reaped: bool,
}

/// Spawns `cmd` in a process group of its own, tied to this process (see the
/// module's documentation), its stdout and stderr captured into `log` (created).
pub fn spawn_tied(cmd: &mut Command, log: &Path) -> std::io::Result<Tied> {
    // A link planted at the log's name is an error, never written through.
    let file = crate::store::fsx::open_truncate(log)?;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // The watchdog starts first, so no moment exists where the node runs unwatched.
    let (reader, writer) = std::io::pipe()?;
    let watchdog = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .stdin(Stdio::from(reader))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let parent = std::process::id() as libc::pid_t;
    let watchdog_fd = std::os::fd::AsRawFd::as_raw_fd(&writer);
    // SAFETY: prctl, getppid, getpid and write are async-signal-safe; nothing
    // here allocates or touches memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            // The group's leader also dies at once with its parent.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A parent that died before the line above took effect sent no
            // signal, and had not yet told the watchdog the group: run nothing.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // The child tells the watchdog its group itself, before it execs:
            // told by the parent after `spawn` returned, a parent SIGKILLed in
            // between left the watchdog without a group while the command had
            // already started a background process, which then outlived it.
            // (The child's copy of the pipe closes at exec: close-on-exec.)
            let line = pid_line(libc::getpid());
            let (bytes, len) = (line.0.as_ptr(), line.1);
            if libc::write(watchdog_fd, bytes.cast(), len) != len as isize {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.process_group(0);
    let mut watchdog = Some((watchdog, writer));
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            finish_watchdog(&mut watchdog);
            return Err(e);
        }
    };
    // For tests: orchestrate dying right after the spawn, the command already
    // running (the window the child's own report to the watchdog closes).
    if std::env::var_os("ORCHESTRATE_FAILPOINT").is_some_and(|v| v == "spawned") {
        std::thread::sleep(Duration::from_millis(300));
        std::process::abort();
    }
    let pgid = child.id() as libc::pid_t;
    let mut child = child;
    let capture = Some(Capture::start(&mut child, log, file));
    // The child told the watchdog its group before it exec'd (see pre_exec).
    Ok(Tied { child, pgid, watchdog, capture, reaped: false })
}

/// `<pid>\n` in a buffer on the stack, for the child to write between fork
/// and exec (no allocation there).
fn pid_line(pid: libc::pid_t) -> ([u8; 24], usize) {
    let mut digits = [0u8; 24];
    let mut n = pid.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut out = [0u8; 24];
    for i in 0..len {
        out[i] = digits[len - 1 - i];
    }
    out[len] = b'\n';
    (out, len + 1)
}

/// Tells the watchdog the group ended normally, and reaps it.
fn finish_watchdog(watchdog: &mut Option<(Child, std::io::PipeWriter)>) {
    if let Some((mut child, mut writer)) = watchdog.take() {
        let _ = writeln!(writer, "done");
        drop(writer);
        let _ = child.wait();
    }
}

impl Tied {
    /// The child's stdin, if it was piped.
    pub fn stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Whether the group's leader has exited, without reaping it: while it is
    /// a zombie its pid, the group's id, cannot be reused, so killing the
    /// group cannot reach anyone else.
    fn leader_exited(&self) -> std::io::Result<bool> {
        // SAFETY: waitid writes only into `info`.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        if unsafe { libc::waitid(libc::P_PID, self.pgid as libc::id_t, &mut info, flags) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: si_pid is set by waitid (0 when no child changed state).
        Ok(unsafe { info.si_pid() } != 0)
    }

    /// Kills everything left in the group, then reaps the leader.
    fn end(&mut self) -> std::io::Result<ExitStatus> {
        // SAFETY: a plain syscall; ESRCH (nobody left) is fine.
        unsafe {
            libc::kill(-self.pgid, libc::SIGKILL);
        }
        let status = self.child.wait();
        self.reaped = true;
        finish_watchdog(&mut self.watchdog);
        status
    }

    /// Waits for the child, killing its group if the run is cancelled. When
    /// the child exits, whatever it left running in its group is killed.
    pub fn wait(mut self, cancel: &AtomicBool) -> Result<Finished, OpError> {
        loop {
            if self.leader_exited().map_err(|e| OpError::io("waiting for a child process", e))? {
                let status = self.end().map_err(|e| OpError::io("waiting for a child process", e))?;
                let output = self.capture.take().expect("captured until waited for").finish();
                return Ok(Finished { status, output });
            }
            if cancel.load(Ordering::Relaxed) {
                self.stop(kill_grace());
                return Err(OpError::Cancelled);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops a cancelled child as a job scheduler does: SIGTERM to its whole
    /// group (a trainer can save, flush its logs, remove its temporary
    /// files), then, when the leader has not exited within `grace`, SIGKILL.
    /// Whatever the leader leaves running is killed either way.
    fn stop(&mut self, grace: Duration) {
        // SAFETY: a plain syscall; ESRCH (nobody left) is fine.
        unsafe {
            libc::kill(-self.pgid, libc::SIGTERM);
        }
        let until = std::time::Instant::now() + grace;
        while std::time::Instant::now() < until {
            if self.leader_exited().unwrap_or(true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.end();
    }
}

/// How long a cancelled node's processes have between SIGTERM and SIGKILL:
/// `ORCHESTRATE_KILL_GRACE` seconds (a decimal number, `0` kills at once),
/// 10 s when it is unset. A value that is not a number is a warning and the
/// default, never a reason to leave a node running.
pub fn kill_grace() -> Duration {
    const DEFAULT: Duration = Duration::from_secs(10);
    match std::env::var("ORCHESTRATE_KILL_GRACE") {
        Err(_) => DEFAULT,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Duration::from_secs_f64(s),
            _ => {
                eprintln!("warning: ORCHESTRATE_KILL_GRACE={v:?} is not a number of seconds from 0 to 3600; using 10");
                DEFAULT
            }
        },
    }
}

impl Drop for Tied {
    /// An error or a panic between spawning and waiting still takes the group down.
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.end();
        }
    }
}

/// "exit code N" or "a signal", for messages.
pub fn describe(status: ExitStatus) -> String {
    status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_line_is_the_decimal_pid_and_a_newline() {
        for pid in [1, 9, 10, 4242, libc::pid_t::MAX] {
            let (buf, len) = pid_line(pid);
            assert_eq!(&buf[..len], format!("{pid}\n").as_bytes());
        }
    }

    #[test]
    fn output_goes_to_the_log_and_its_end_is_kept_for_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("n.log");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo to-stdout; echo to-stderr >&2; exit 3");
        let finished = spawn_tied(&mut cmd, &log).unwrap().wait(&AtomicBool::new(false)).unwrap();
        assert_eq!(finished.status.code(), Some(3));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("to-stdout") && text.contains("to-stderr"), "{text}");
        let lines = finished.output.last_lines(10);
        assert!(lines.contains("to-stdout") && lines.contains("to-stderr") && lines.contains("n.log"), "{lines}");
    }

    #[test]
    fn a_log_that_cannot_be_written_loses_nothing_the_error_needs() {
        // /dev/full: every write fails with ENOSPC, as on a full disk.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo the reason >&2; exit 1");
        let finished = spawn_tied(&mut cmd, Path::new("/dev/full")).unwrap().wait(&AtomicBool::new(false)).unwrap();
        let lines = finished.output.last_lines(10);
        assert!(lines.contains("the reason") && lines.contains("No space left on device"), "{lines}");
    }

    fn alive(pid: i32) -> bool {
        // A zombie (or a reaped process) is not alive.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(false)
    }

    #[test]
    fn what_a_child_leaves_running_in_its_group_dies_when_it_exits() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!("sleep 30 & echo $! > {}", pidfile.display()));
        let finished = spawn_tied(&mut cmd, &dir.path().join("log")).unwrap().wait(&AtomicBool::new(false)).unwrap();
        assert!(finished.status.success());
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while alive(pid) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(pid), "the grandchild {pid} outlived its node");
    }

    /// A cancelled node gets SIGTERM first and the grace period to act on it
    /// (before, it was SIGKILLed at once: a trainer could not save or clean
    /// up); one that ignores SIGTERM is killed when the grace period ends.
    #[test]
    fn cancelling_sends_sigterm_first_and_sigkill_after_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let said = dir.path().join("said");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!(
            "trap 'echo term > {}; exit 3' TERM; echo up > {}.up; while :; do sleep 0.01; done",
            said.display(),
            said.display()
        ));
        let mut tied = spawn_tied(&mut cmd, &dir.path().join("log")).unwrap();
        let up = dir.path().join("said.up");
        while !up.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
        tied.stop(Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&said).unwrap().trim(), "term", "the node never saw SIGTERM");

        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!("trap '' TERM; echo up > {}; while :; do sleep 0.01; done", up.display()));
        std::fs::remove_file(&up).unwrap();
        let mut tied = spawn_tied(&mut cmd, &dir.path().join("log2")).unwrap();
        while !up.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = tied.pgid;
        let t = std::time::Instant::now();
        tied.stop(Duration::from_millis(300));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(300), "killed before the grace period ended: {took:?}");
        assert!(!alive(pid), "a node that ignores SIGTERM outlived the grace period");
    }

    #[test]
    fn cancelling_kills_the_whole_group_and_dropping_does_too() {
        let dir = tempfile::tempdir().unwrap();
        for cancel_it in [true, false] {
            let pidfile = dir.path().join(format!("gc-{cancel_it}.pid"));
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(format!("sleep 30 & echo $! > {}; wait", pidfile.display()));
            let tied = spawn_tied(&mut cmd, &dir.path().join("log")).unwrap();
            while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
            if cancel_it {
                assert!(matches!(tied.wait(&AtomicBool::new(true)), Err(OpError::Cancelled)));
            } else {
                drop(tied);
            }
            std::thread::sleep(Duration::from_millis(50));
            assert!(!alive(pid), "cancel={cancel_it}: the grandchild {pid} survived");
        }
    }
}
