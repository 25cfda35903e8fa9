//! Running a child process for an op: in a process group of its own that dies
//! with the node (on success, failure, cancel, an error or panic here) and
//! with orchestrate itself, even when orchestrate is SIGKILLed. Cancellable,
//! logged.
//!
//! A node's command may start processes of its own (`cmd &`, a data loader's
//! workers). They share the node's process group, so the whole group is
//! killed: when the node's main process exits (what it left running would
//! otherwise keep writing into the tree), when the run is cancelled, and, if
//! orchestrate dies without a chance to do it, by the watchdog. The watchdog is
//! one small `sh` per orchestrate process (not one per node: a 200-node run
//! started 400 processes), holding the read end of a pipe whose only write end
//! is orchestrate's. Orchestrate tells it `+GROUP` when it starts a node's
//! process, before that process may do anything (it waits at a gate, see
//! [`spawn_tied`]), and `-GROUP` once that group is gone; when orchestrate
//! dies, however it dies, the kernel closes the write end and the watchdog,
//! reading end-of-file, kills every group it still holds. (A process that
//! leaves the group on purpose, with `setsid`, escapes this, as it escapes a
//! terminal's Ctrl-C.)
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
use std::sync::Mutex;
use std::time::Duration;

use super::OpError;

/// The watchdog: keeps the groups it is told (`+G` adds, `-G` removes, one
/// line each, every line written whole in one `write` under `PIPE_BUF`, so
/// lines from several writers never mix); end-of-file means orchestrate is
/// gone, and every group it still holds is killed. It ignores the terminal's
/// signals so that only its pipe decides.
const WATCHDOG: &str = r#"trap '' HUP INT TERM
held=' '
while read -r line; do
  g=${line#?}
  case $line in
    +*) held="$held$g " ;;
    -*) case $held in *" $g "*) held="${held%%" $g "*} ${held#*" $g "}" ;; esac ;;
  esac
done
for g in $held; do kill -s KILL -- "-$g" 2>/dev/null; done
exit 0"#;

/// This process's watchdog, started with the first tied child.
struct Watchdog {
    child: Child,
    writer: std::io::PipeWriter,
    /// The groups it holds: restarted (someone killed it), it is told them again.
    held: std::collections::BTreeSet<libc::pid_t>,
}

static WATCHDOG_PROCESS: Mutex<Option<Watchdog>> = Mutex::new(None);

impl Watchdog {
    fn start() -> std::io::Result<Watchdog> {
        let (reader, writer) = std::io::pipe()?;
        let child = Command::new(sh())
            .arg("-c")
            .arg(WATCHDOG)
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Watchdog { child, writer, held: Default::default() })
    }

    /// The running watchdog (started, or started again and told the groups
    /// it held, when it is not running), locked: a spawn holds the lock, so
    /// the descriptor its child writes to cannot be closed under it by a
    /// restart on another thread.
    fn running() -> std::io::Result<std::sync::MutexGuard<'static, Option<Watchdog>>> {
        let mut slot = WATCHDOG_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        let running = match slot.as_mut() {
            Some(w) => w.child.try_wait()?.is_none(),
            None => false,
        };
        if !running {
            let held = slot.take().map(|w| w.held).unwrap_or_default();
            let mut fresh = Watchdog::start()?;
            for g in &held {
                fresh.say(b'+', *g)?;
            }
            fresh.held = held;
            *slot = Some(fresh);
        }
        Ok(slot)
    }

    fn say(&mut self, sign: u8, group: libc::pid_t) -> std::io::Result<()> {
        let (line, len) = group_line(sign, group);
        // One write of a few bytes to a pipe: whole or not at all.
        self.writer.write_all(&line[..len])
    }

    /// Tells the watchdog a group is gone (its leader reaped, or it never ran).
    fn release(group: libc::pid_t) {
        let mut slot = WATCHDOG_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = slot.as_mut() {
            w.held.remove(&group);
            let _ = w.say(b'-', group);
        }
    }
}

/// How much of a child's output is kept in memory (the end of it).
const TAIL_BYTES: usize = 16 << 10;

/// Where a child's output goes: its log file, and the last [`TAIL_BYTES`].
struct Sink {
    /// The log: an earlier attempt's, emptied, or `None` until the first
    /// byte comes, so a node that writes nothing leaves no log (making a
    /// file per node was a sixth of a small node's own time on ext4).
    file: Option<std::fs::File>,
    log: PathBuf,
    tail: Vec<u8>,
    /// The first error making or writing the log; after it nothing more is written there.
    error: Option<std::io::Error>,
}

impl Sink {
    fn take(&mut self, chunk: &[u8]) {
        if self.error.is_none() {
            // A link planted at the log's name is an error, never written through.
            let written = match &mut self.file {
                Some(file) => file.write_all(chunk),
                None => crate::store::fsx::open_truncate(&self.log).and_then(|mut file| {
                    let written = file.write_all(chunk);
                    self.file = Some(file);
                    written
                }),
            };
            if let Err(e) = written {
                self.error = Some(e);
            }
        }
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
    }
}

/// A child's stdout and stderr (one pipe, as a terminal shows them: in the
/// order written), read into its [`Sink`] by the thread that waits for it,
/// with a pidfd saying when the child exits: no thread started per stream.
struct Capture {
    sink: Sink,
    /// The read end; `None` once it reached end-of-file.
    pipe: Option<std::io::PipeReader>,
    /// The child's pidfd (`pidfd_open`), where the kernel has them.
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl Capture {
    fn new(pipe: std::io::PipeReader, pid: libc::pid_t, log: &Path, file: Option<std::fs::File>) -> Capture {
        use std::os::fd::FromRawFd;
        // SAFETY: a plain syscall; a descriptor it returns is ours alone.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) });
        let sink = Sink { file, log: log.to_path_buf(), tail: Vec::new(), error: None };
        Capture { sink, pipe: Some(pipe), pidfd }
    }

    /// Waits up to `timeout` for output (read into the sink) or the child's
    /// exit, whichever comes first.
    fn pump(&mut self, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let mut fds = Vec::with_capacity(2);
        if let Some(pipe) = &self.pipe {
            fds.push(libc::pollfd { fd: pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        if let Some(pidfd) = &self.pidfd {
            fds.push(libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        if fds.is_empty() {
            // No pidfd (a kernel before 5.3) and the output ended: the exit
            // is polled, every 2 ms as before.
            std::thread::sleep(Duration::from_millis(2));
            return;
        }
        // Without a pidfd the exit is polled: a short wait.
        let ms = if self.pidfd.is_some() { timeout.as_millis() } else { 2 };
        // SAFETY: `fds` lives across the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms as libc::c_int) };
        if ready > 0 && self.pipe.is_some() && fds[0].revents != 0 {
            self.read_some();
        }
    }

    /// One read of what is there; end-of-file (or an error) ends the pipe.
    fn read_some(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else { return };
        let mut buf = [0u8; 8192];
        match pipe.read(&mut buf) {
            Ok(0) => self.pipe = None,
            Ok(n) => self.sink.take(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
    }

    /// Reads what is left until end-of-file (at most 2 s: a process that left
    /// the group with `setsid` may hold the pipe open), then says what was captured.
    fn finish(mut self) -> Output {
        use std::os::fd::AsRawFd;
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while let Some(pipe) = &self.pipe {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fd = libc::pollfd { fd: pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: `fd` lives across the call.
            if unsafe { libc::poll(&mut fd, 1, left.as_millis().max(1) as libc::c_int) } > 0 {
                self.read_some();
            }
        }
        Output { tail: self.sink.tail, log: self.sink.log, log_error: self.sink.error.as_ref().map(|e| e.to_string()) }
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
    capture: Option<Capture>,
    reaped: bool,
}

/// Spawns `cmd` in a process group of its own, tied to this process (see the
/// module's documentation), its stdout and stderr captured into `log` (an
/// earlier one emptied; a new one made when the child first writes).
///
/// The child's stdin is a pipe, and it is the child's gate: the child must
/// read it to its end before it does anything (the shell op's script starts
/// with [`shell_gate`]; the worker reads its job from it). The watchdog is
/// told the child's group before the caller writes anything there, so when
/// orchestrate dies between starting the child and telling the watchdog, the
/// child reads end-of-file and exits without having run anything.
///
/// No code runs in the child between fork and exec: that lets the standard
/// library start it with `posix_spawn` (a `vfork`), not a `fork` copying
/// this process's page tables, whose copy-on-write faults were a fifth of a
/// 200-node run's time.
pub fn spawn_tied(cmd: &mut Command, log: &Path) -> std::io::Result<Tied> {
    spawn_tied_gated(cmd, log, Stdio::piped())
}

/// [`spawn_tied`] with the child's stdin given: a socket whose other end the
/// caller holds (the worker's gate and its ledger channel, see
/// `worker::run_in_worker`) instead of a pipe. The gate's promise is the
/// same: until the caller writes there, the child reads nothing, and an
/// orchestrate gone leaves it end-of-file.
pub fn spawn_tied_gated(cmd: &mut Command, log: &Path, gate: Stdio) -> std::io::Result<Tied> {
    // An earlier attempt's log is emptied now (a link planted at its name is
    // an error, never written through); a new one is made when the child
    // first writes.
    let file = match std::fs::symlink_metadata(log) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        _ => Some(crate::store::fsx::open_truncate(log)?),
    };
    let (output, output_w) = std::io::pipe()?;
    cmd.stdin(gate).stdout(output_w.try_clone()?).stderr(output_w).process_group(0);
    // The watchdog runs before the child does, so no moment exists where the
    // node runs unwatched; its lock is held until it holds the new group.
    let mut watchdog = Watchdog::running()?;
    let spawned = cmd.spawn();
    // The command keeps its copies of the output pipe's write end (and of a
    // given gate) until told otherwise; with one left here the pipe would
    // never end.
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let child = spawned?;
    let pgid = child.id() as libc::pid_t;
    // For tests: orchestrate dying after the spawn, before the watchdog
    // holds the group: the child finds its gate closed and runs nothing.
    if std::env::var_os("ORCHESTRATE_FAILPOINT").is_some_and(|v| v == "spawned-unwatched") {
        std::thread::sleep(Duration::from_millis(300));
        std::process::abort();
    }
    let w = watchdog.as_mut().expect("running");
    w.say(b'+', pgid)?;
    w.held.insert(pgid);
    drop(watchdog);
    let capture = Some(Capture::new(output, pgid, log, file));
    Ok(Tied { child, pgid, capture, reaped: false })
}

/// What a shell op's script starts with: it waits at its gate (its stdin,
/// see [`spawn_tied`]) and exits 125 if the gate closes without a line, then
/// gives the script an empty stdin, as it had before. On the script's first
/// line, so the shell's line numbers in error messages stay the user's.
pub const SHELL_GATE: &str = "read -r ORCHESTRATE_GATE || exit 125; unset ORCHESTRATE_GATE; exec </dev/null; ";

/// The program a node's `sh` is: the first `sh` on this process's `PATH`,
/// looked up once per process (the child inherits that `PATH`), so starting
/// a command does not try to execute `sh` in every folder before it (eight
/// failed `execve` a node on a machine whose `PATH` starts with
/// `~/.cargo/bin` and pyenv's shims). Where the lookup could differ from the
/// child's own (no `PATH`, a relative entry, which the child would read from
/// the node's folder), it is plain `sh`, and the child searches as before.
pub fn sh() -> &'static std::ffi::OsStr {
    static SH: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();
    SH.get_or_init(|| {
        std::env::var_os("PATH")
            .and_then(|path| first_on_path("sh", &path))
            .map(PathBuf::into_os_string)
            .unwrap_or_else(|| "sh".into())
    })
}

/// The first executable regular file `name` in the folders of `path`, as
/// `execvp` would find it; `None` when a relative (or empty) entry comes
/// first, or none holds one.
fn first_on_path(name: &str, path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    for dir in std::env::split_paths(path) {
        if !dir.is_absolute() {
            return None;
        }
        let candidate = dir.join(name);
        if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) {
            return Some(candidate);
        }
    }
    None
}

/// `script` behind [`SHELL_GATE`].
pub fn shell_gate(script: &str) -> String {
    format!("{SHELL_GATE}{script}")
}

/// `+<pid>\n` (or `-`) in a buffer on the stack, for the child to write
/// between fork and exec (no allocation there).
fn group_line(sign: u8, pid: libc::pid_t) -> ([u8; 24], usize) {
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
    out[0] = sign;
    for i in 0..len {
        out[1 + i] = digits[len - 1 - i];
    }
    out[1 + len] = b'\n';
    (out, len + 2)
}

impl Tied {
    /// The child's stdin, its gate: what is written there, then closing it,
    /// lets the child go.
    pub fn stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Opens a shell op's gate ([`SHELL_GATE`]): one line, then end-of-file.
    pub fn open_gate(&mut self) -> std::io::Result<()> {
        match self.child.stdin.take() {
            Some(mut stdin) => stdin.write_all(b"go\n"),
            None => Ok(()),
        }
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
        // Reaped, the leader's pid (the group's id) may be reused: the
        // watchdog lets go of it now, the group already killed above.
        Watchdog::release(self.pgid);
        status
    }

    /// Waits for the child, killing its group if the run is cancelled. When
    /// the child exits, whatever it left running in its group is killed.
    pub fn wait(mut self, cancel: &AtomicBool) -> Result<Finished, OpError> {
        // For tests: orchestrate dying right after a node's process was let
        // go, its command already running (what the watchdog is for).
        if std::env::var_os("ORCHESTRATE_FAILPOINT").is_some_and(|v| v == "spawned") {
            std::thread::sleep(Duration::from_millis(300));
            std::process::abort();
        }
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
            // Output is read as it comes; the child's exit wakes this at once
            // (its pidfd), the cancel flag within 20 ms.
            self.capture.as_mut().expect("captured until waited for").pump(Duration::from_millis(20));
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
            // Still read its output: a trainer saving on SIGTERM must not
            // block on a full pipe until the grace period ends.
            match self.capture.as_mut() {
                Some(capture) => capture.pump(Duration::from_millis(5)),
                None => std::thread::sleep(Duration::from_millis(5)),
            }
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

    /// `sh` is looked up as `execvp` would: the first executable file of
    /// the absolute folders; a relative entry before it leaves the search to
    /// the child.
    #[test]
    fn sh_is_the_first_executable_one_on_the_path_unless_a_relative_entry_comes_first() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (plain, folder, runnable, also) =
            (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"), dir.path().join("d"));
        for d in [&plain, &folder, &runnable, &also] {
            std::fs::create_dir(d).unwrap();
        }
        // Not executable, a folder, then the one, then a later one.
        std::fs::write(plain.join("sh"), "").unwrap();
        std::fs::create_dir(folder.join("sh")).unwrap();
        for d in [&runnable, &also] {
            std::fs::write(d.join("sh"), "").unwrap();
            std::fs::set_permissions(d.join("sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
        assert_eq!(first_on_path("sh", &path(&[&plain, &folder, &runnable, &also])), Some(runnable.join("sh")));
        assert_eq!(first_on_path("sh", &path(&[&plain, Path::new("rel"), &runnable])), None);
        assert_eq!(first_on_path("sh", &path(&[&plain, &folder])), None);
        assert_eq!(first_on_path("sh", std::ffi::OsStr::new(&format!(":{}", runnable.display()))), None);
        assert!(Path::new(sh()).is_absolute() || sh() == "sh");
    }

    #[test]
    fn the_group_line_is_the_sign_the_decimal_pid_and_a_newline() {
        for pid in [1, 9, 10, 4242, libc::pid_t::MAX] {
            let (buf, len) = group_line(b'+', pid);
            assert_eq!(&buf[..len], format!("+{pid}\n").as_bytes());
            let (buf, len) = group_line(b'-', pid);
            assert_eq!(&buf[..len], format!("-{pid}\n").as_bytes());
        }
    }

    /// Tied children share one watchdog (a 200-node run started 200 of them
    /// beside its nodes before).
    #[test]
    fn tied_children_share_one_watchdog() {
        let dir = tempfile::tempdir().unwrap();
        let mut tied = Vec::new();
        for i in 0..3 {
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg("sleep 30");
            tied.push(spawn_tied(&mut cmd, &dir.path().join(format!("log{i}"))).unwrap());
        }
        let me = std::process::id().to_string();
        let watchdogs = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
            .filter(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let ppid = stat.rsplit(')').next().unwrap_or("").split_whitespace().nth(1).unwrap_or("").to_string();
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                ppid == me && String::from_utf8_lossy(&cmdline).contains("trap '' HUP INT TERM")
            })
            .count();
        drop(tied);
        assert_eq!(watchdogs, 1, "each tied child started a watchdog of its own");
    }

    /// The watchdog kills, at end-of-file, the groups it still holds and
    /// none it was told are gone (whose ids the kernel may have reused).
    #[test]
    fn the_watchdog_kills_the_groups_it_holds_and_spares_those_let_go() {
        let group = || Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let (mut held, mut let_go, mut also_held) = (group(), group(), group());
        let mut watchdog = Command::new("sh").arg("-c").arg(WATCHDOG).stdin(Stdio::piped()).spawn().unwrap();
        let mut stdin = watchdog.stdin.take().unwrap();
        for (sign, child) in [(b'+', &held), (b'+', &let_go), (b'+', &also_held), (b'-', &let_go)] {
            let (line, len) = group_line(sign, child.id() as libc::pid_t);
            stdin.write_all(&line[..len]).unwrap();
        }
        drop(stdin);
        watchdog.wait().unwrap();
        let dead = |c: &mut Child| {
            let until = std::time::Instant::now() + Duration::from_secs(2);
            while std::time::Instant::now() < until {
                if c.try_wait().unwrap().is_some() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        };
        assert!(dead(&mut held) && dead(&mut also_held), "a held group outlived orchestrate");
        assert!(!dead(&mut let_go), "a group let go of was killed");
        let_go.kill().unwrap();
        let_go.wait().unwrap();
    }

    /// A gated script whose gate closes without a line (orchestrate died
    /// before the watchdog held its group) runs nothing; opened, it runs.
    #[test]
    fn a_gated_script_runs_only_once_its_gate_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        for open in [false, true] {
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(shell_gate(&format!("read -r x; echo \"stdin:$x\"; touch {}", ran.display())));
            let mut tied = spawn_tied(&mut cmd, &dir.path().join(format!("log-{open}"))).unwrap();
            if open {
                tied.open_gate().unwrap();
            } else {
                drop(tied.stdin());
            }
            let finished = tied.wait(&AtomicBool::new(false)).unwrap();
            assert_eq!(ran.exists(), open);
            if open {
                // The script itself reads an empty stdin, as before the gate.
                assert!(finished.status.success());
                let log = std::fs::read_to_string(dir.path().join("log-true")).unwrap();
                assert_eq!(log.trim(), "stdin:", "{log}");
            } else {
                assert_eq!(finished.status.code(), Some(125));
            }
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

    /// A child that writes nothing leaves no log; one that writes makes it;
    /// a silent attempt after a talkative one leaves its log empty, not the
    /// earlier attempt's words.
    #[test]
    fn a_log_is_made_when_the_child_first_writes_and_an_earlier_one_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("n.log");
        let run = |script: &str| {
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(script);
            let finished = spawn_tied(&mut cmd, &log).unwrap().wait(&AtomicBool::new(false)).unwrap();
            assert!(finished.status.success(), "{script}");
        };
        run("true");
        assert!(!log.exists(), "a silent child made a log");
        run("echo first attempt");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "first attempt\n");
        run("true");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "", "an earlier attempt's log was kept");
    }

    /// Read as it comes by the waiting thread: more than a pipe holds, from
    /// both streams, all reaches the log and the child never blocks on it.
    #[test]
    fn output_larger_than_a_pipe_reaches_the_log_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("big.log");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("head -c 300000 /dev/zero | tr '\\0' o; head -c 200000 /dev/zero | tr '\\0' e >&2");
        let finished = spawn_tied(&mut cmd, &log).unwrap().wait(&AtomicBool::new(false)).unwrap();
        assert!(finished.status.success());
        let text = std::fs::read(&log).unwrap();
        assert_eq!(text.len(), 500_000);
        assert_eq!(text.iter().filter(|&&b| b == b'o').count(), 300_000);
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
