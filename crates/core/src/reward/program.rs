//! A reward program: the researcher's command, started once per node in the
//! spec's folder, in a process group of its own (killed with everything it
//! started when the node ends, fails or its parent dies), speaking JSON lines.
//!
//! Each request is one line of JSON on the program's stdin
//! ([`super::RewardRequest`]); each reply one line on its stdout
//! ([`super::RewardReply`]), within `timeout_s` seconds. A reply line is at
//! most [`MAX_REPLY_BYTES`]; the program's stderr is drained, its last
//! [`STDERR_TAIL_BYTES`] kept for errors. Nothing it writes is executed or
//! written anywhere by us.

use std::io::{BufRead, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::python::{python_module_files, PythonRun};
use super::{RewardError, RewardReply, RewardRequest};
use crate::store::fsx::normalize_rel;

/// Seconds a program has for each reply unless its term says otherwise.
pub const DEFAULT_TIMEOUT_S: f64 = 10.0;
/// The longest reply line read (64 KiB): a reply is a few dozen bytes.
pub const MAX_REPLY_BYTES: usize = 64 << 10;
/// How much of the program's stderr an error quotes.
pub const STDERR_TAIL_BYTES: usize = 4 << 10;
/// Seconds `INTERPRETER --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Seconds a program has to exit after its stdin closes, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A program as a term (or `eval.score`'s `program`) names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// The program and its arguments, run in the spec's folder (`[python3, rewards/format.py]`).
    pub command: Vec<String>,
    /// More files it reads, relative to the spec's folder (in the key by content).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// Seconds it has for each reply.
    #[serde(default = "d_timeout")]
    pub timeout_s: f64,
}

fn d_timeout() -> f64 {
    DEFAULT_TIMEOUT_S
}

impl ProgramSpec {
    /// What is wrong with it, as (field, message).
    pub fn check(&self) -> Result<(), (String, String)> {
        let Some(first) = self.command.first() else {
            return Err(("command".into(), "expected a program and its arguments, e.g. [python3, reward.py]".into()));
        };
        if first.is_empty() {
            return Err(("command".into(), "the program's name is empty".into()));
        }
        if first.contains('/') && normalize_rel(first).is_none() {
            return Err((
                "command".into(),
                format!("'{first}': a program given by path must be relative to the spec's folder, inside it"),
            ));
        }
        for f in &self.files {
            if normalize_rel(f).is_none() {
                return Err((
                    "files".into(),
                    format!("'{f}': expected a path relative to the spec's folder, inside it"),
                ));
            }
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            return Err(("timeout_s".into(), format!("{}: expected seconds in (0, 3600]", self.timeout_s)));
        }
        Ok(())
    }

    /// The interpreter found on PATH (`python3`), when the program is not a
    /// file of the project (`./score.sh`, `tools/score`).
    pub fn interpreter(&self) -> Option<&str> {
        self.command.first().map(String::as_str).filter(|c| !c.contains('/'))
    }

    /// The files whose content the rewards depend on, relative to the spec's
    /// folder: the declared `files`, a program given by path, and every
    /// argument that names a file in the folder (`rewards/format.py`), and
    /// for a Python program, the modules of the folder its script imports
    /// ([`super::python`]).
    pub fn files(&self, spec_dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = self.files.iter().filter_map(|f| normalize_rel(f)).collect();
        // A link is listed too: hashing it is then refused, naming it,
        // rather than the program's script silently leaving the key.
        let there = |rel: &str| super::python::there(spec_dir, rel);
        let python = self.interpreter().is_some_and(super::python::names_python);
        let skip = usize::from(self.interpreter().is_some());
        let mut args = self.command.iter().skip(skip);
        // What Python runs first, and its `sys.path[0]`: the script's folder,
        // or the working folder (the spec's) for `-m` and `-c`.
        let mut runs: Option<PythonRun> = None;
        while let Some(arg) = args.next() {
            // `python3 -m rewards.judge` (or `-mrewards.judge`): the module's files.
            let module = match arg.strip_prefix("-m") {
                Some("") if python => args.next().map(String::as_str),
                Some(m) if python && !m.starts_with('-') => Some(m),
                _ => None,
            };
            if let Some(module) = module {
                let files: Vec<String> = python_module_files(module).into_iter().filter(|f| there(f)).collect();
                runs.get_or_insert_with(|| PythonRun { files: files.clone(), path0: String::new(), code: None });
                out.extend(files);
                continue;
            }
            if python && arg == "-c" {
                // `python3 -c 'from rewards import judge; judge.main()'`: the code's imports.
                let code = args.next().cloned();
                runs.get_or_insert_with(|| PythonRun { files: Vec::new(), path0: String::new(), code });
                continue;
            }
            if arg.starts_with('-') {
                continue;
            }
            if let Some(rel) = normalize_rel(arg) {
                if there(&rel) {
                    if !python && runs.is_none() && self.interpreter().is_none() {
                        // The program itself, given by path: Python's if its first line says so.
                        runs = PythonRun::by_shebang(spec_dir, &rel);
                    }
                    if python {
                        runs.get_or_insert_with(|| {
                            PythonRun::script(rel.clone(), crate::store::fsx::parent_rel(&rel).to_string())
                        });
                    }
                    out.push(rel);
                } else if python && spec_dir.join(&rel).is_dir() && there(&format!("{rel}/__main__.py")) {
                    // Python runs a folder as its `__main__.py`.
                    let main = format!("{rel}/__main__.py");
                    runs.get_or_insert_with(|| PythonRun::script(main.clone(), rel.clone()));
                    out.push(main);
                }
            }
        }
        if let Some(run) = runs {
            out.extend(super::python::imported_files(spec_dir, &run));
        }
        out.sort();
        out.dedup();
        out
    }

    /// The command as one line, for messages.
    pub fn display(&self) -> String {
        self.command.join(" ")
    }

    /// blake3 of the command, the content of each of its files and the
    /// interpreter's version: the program's identity in a run's records.
    pub fn digest(&self, spec_dir: &Path) -> Result<String, RewardError> {
        let mut h = blake3::Hasher::new();
        h.update(b"orchestrate.reward-program.v1\0");
        for c in &self.command {
            h.update(c.as_bytes());
            h.update(b"\0");
        }
        for rel in self.files(spec_dir) {
            let mut file = crate::store::fsx::open_user_file(spec_dir, &rel)
                .map_err(|e| RewardError(format!("program '{}': {e}", self.display())))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)
                .map_err(|e| RewardError(format!("program '{}': reading {rel}: {e}", self.display())))?;
            h.update(rel.as_bytes());
            h.update(b"\0");
            h.update(blake3::hash(&bytes).as_bytes());
        }
        if let Some(i) = self.interpreter() {
            h.update(interpreter_version(i)?.as_bytes());
        }
        Ok(h.finalize().to_hex().to_string())
    }
}

/// `INTERPRETER --version`, its first line of output (stdout, else stderr;
/// Python 2 printed it on stderr), with a time limit: what the key holds of
/// an interpreter, so upgrading Python re-runs the nodes whose rewards it computes.
pub fn interpreter_version(interpreter: &str) -> Result<String, RewardError> {
    let mut child = Command::new(interpreter)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            RewardError(format!(
                "reward program interpreter '{interpreter}': cannot run `{interpreter} --version`: {e}"
            ))
        })?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < VERSION_TIMEOUT => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                kill_group(&child);
                let _ = child.wait();
                return Err(RewardError(format!(
                    "reward program interpreter '{interpreter}': `{interpreter} --version` did not finish in {} s",
                    VERSION_TIMEOUT.as_secs()
                )));
            }
        }
    }
    let mut text = String::new();
    for stream in [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut buf = Vec::new();
        let _ = stream.take(4096).read_to_end(&mut buf);
        let line = String::from_utf8_lossy(&buf).lines().next().unwrap_or("").trim().to_string();
        if !line.is_empty() {
            text = line;
            break;
        }
    }
    if text.is_empty() {
        return Err(RewardError(format!(
            "reward program interpreter '{interpreter}': `{interpreter} --version` printed nothing"
        )));
    }
    Ok(text)
}

/// The child's exit status if it exits within `grace` (not reaped past it).
fn exited_within(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

fn kill_group(child: &Child) {
    // SAFETY: a plain syscall on the group this child leads; ESRCH is fine.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
}

/// What the stdout reader hands over: a reply line, or why none came.
enum Line {
    Reply(String),
    TooLong,
    Eof,
    Failed(String),
}

/// A running reward program.
pub struct RewardProgram {
    /// The term's name.
    name: String,
    display: String,
    digest: String,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    stderr: Arc<Mutex<Vec<u8>>>,
    timeout: Duration,
    seconds: f64,
}

impl RewardProgram {
    /// Starts the program in `spec_dir`.
    pub fn start(name: &str, spec: &ProgramSpec, spec_dir: &Path) -> Result<RewardProgram, RewardError> {
        spec.check().map_err(|(f, m)| RewardError(format!("reward '{name}': {f}: {m}")))?;
        let display = spec.display();
        let digest = spec.digest(spec_dir)?;
        let mut cmd = Command::new(&spec.command[0]);
        cmd.args(&spec.command[1..])
            .current_dir(spec_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("PYTHONUNBUFFERED", "1")
            .process_group(0);
        // SAFETY: prctl is async-signal-safe: the program dies with its parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            RewardError(format!("reward '{name}': cannot start `{display}` in {}: {e}", spec_dir.display()))
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let stderr_pipe = child.stderr.take().expect("piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                let got = (&mut reader).take(MAX_REPLY_BYTES as u64 + 1).read_until(b'\n', &mut line);
                let msg = match got {
                    Err(e) => Line::Failed(e.to_string()),
                    Ok(0) => Line::Eof,
                    Ok(_) if !line.ends_with(b"\n") && line.len() > MAX_REPLY_BYTES => Line::TooLong,
                    Ok(_) if !line.ends_with(b"\n") => Line::Eof,
                    Ok(_) => Line::Reply(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned()),
                };
                let last = !matches!(msg, Line::Reply(_));
                if tx.send(msg).is_err() || last {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut pipe = stderr_pipe;
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                t.extend_from_slice(&buf[..n]);
                if t.len() > STDERR_TAIL_BYTES {
                    let cut = t.len() - STDERR_TAIL_BYTES;
                    t.drain(..cut);
                }
            }
        });
        Ok(RewardProgram {
            name: name.to_string(),
            display,
            digest,
            child: Some(child),
            stdin,
            lines,
            stderr,
            timeout: Duration::from_secs_f64(spec.timeout_s),
            seconds: 0.0,
        })
    }

    /// The command as one line.
    pub fn command(&self) -> &str {
        &self.display
    }

    /// The program's identity ([`ProgramSpec::digest`]).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Seconds spent waiting for replies.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    fn stderr_tail(&self) -> String {
        // Let the drain thread catch up with what the program wrote last.
        std::thread::sleep(Duration::from_millis(20));
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&t);
        let text = text.trim();
        if text.is_empty() {
            String::new()
        } else {
            format!("; its stderr ends:\n{text}")
        }
    }

    /// Kills the group and says how the leader ended.
    fn end(&mut self) -> String {
        let Some(mut child) = self.child.take() else { return "ended".into() };
        self.stdin = None;
        // A program that is exiting gets a moment, so the status is its own, not our kill's.
        let status = exited_within(&mut child, Duration::from_millis(300));
        kill_group(&child);
        let status = status.or_else(|| child.wait().ok());
        match status {
            Some(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "ended".into(),
            },
            None => "ended".into(),
        }
    }

    fn fail(&mut self, request: &RewardRequest, what: String) -> RewardError {
        let tail = self.stderr_tail();
        self.end();
        RewardError(format!(
            "reward '{}' (`{}`): row {} (problem {}): {what}{tail}",
            self.name, self.display, request.row, request.id
        ))
    }

    /// Sends one request and reads its reply.
    pub fn call(&mut self, request: &RewardRequest) -> Result<RewardReply, RewardError> {
        if self.child.is_none() {
            return Err(RewardError(format!("reward '{}' (`{}`): the program has ended", self.name, self.display)));
        }
        let mut line = serde_json::to_string(request).expect("a request serializes");
        line.push('\n');
        let started = Instant::now();
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin closed")),
        };
        if let Err(e) = sent {
            // Most often the program exited: how it ended is the better error.
            let tail = self.stderr_tail();
            let how = self.end();
            return Err(RewardError(format!(
                "reward '{}' (`{}`): row {} (problem {}): the request could not be written ({e}): the program {how}{tail}",
                self.name, self.display, request.row, request.id
            )));
        }
        let got = self.lines.recv_timeout(self.timeout);
        self.seconds += started.elapsed().as_secs_f64();
        let text = match got {
            Ok(Line::Reply(text)) => text,
            Ok(Line::TooLong) => {
                return Err(self.fail(
                    request,
                    format!(
                        "its reply is over {MAX_REPLY_BYTES} bytes without a line end (a reply is one line of JSON)"
                    ),
                ))
            }
            Ok(Line::Failed(e)) => return Err(self.fail(request, format!("reading its reply: {e}"))),
            Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                let tail = self.stderr_tail();
                let how = self.end();
                return Err(RewardError(format!(
                    "reward '{}' (`{}`): row {} (problem {}): the program {how} without replying{tail}",
                    self.name, self.display, request.row, request.id
                )));
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(self.fail(
                    request,
                    format!("no reply within {} s (timeout_s); the program was killed", self.timeout.as_secs_f64()),
                ))
            }
        };
        parse_reply(&text).map_err(|what| self.fail(request, what.to_string()))
    }

    /// Closes the program's stdin, lets it exit (it is killed after a grace
    /// period), and fails if it wrote an extra reply or exited with an error.
    pub fn finish(mut self) -> Result<(), RewardError> {
        self.stdin = None;
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let status = exited_within(&mut child, EXIT_GRACE);
        kill_group(&child);
        let _ = child.wait();
        if let Ok(Line::Reply(extra)) = self.lines.try_recv() {
            return Err(RewardError(format!(
                "reward '{}' (`{}`): it wrote a line no request asked for: {}",
                self.name,
                self.display,
                quote(&extra)
            )));
        }
        match status {
            Some(s) if !s.success() => {
                let tail = self.stderr_tail();
                Err(RewardError(format!(
                    "reward '{}' (`{}`): the program exited with {s} after its last reply{tail}",
                    self.name, self.display
                )))
            }
            _ => Ok(()),
        }
    }
}

impl Drop for RewardProgram {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&child);
            let _ = child.wait();
        }
    }
}

/// The first 200 characters of a reply, quoted.
fn quote(text: &str) -> String {
    let short: String = text.chars().take(200).collect();
    let more = if text.chars().count() > 200 { "…" } else { "" };
    format!("{short:?}{more}")
}

/// The shape a reply must have.
const REPLY_SHAPE: &str = "{\"reward\": <finite number>, \"valid\": <bool>, \"reason\": <string or null>}";

/// What is wrong with a program's reply line; `reply` is its first 200
/// characters, quoted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplyError {
    #[error("its reward {reward} is not a finite number; the reply: {reply}")]
    NotFinite { reward: f64, reply: String },
    #[error("its reward is not a finite number (JSON has no NaN or Infinity; Python's json.dumps writes them unless allow_nan=False); the reply: {reply}")]
    NonFiniteLiteral { reply: String },
    #[error("its reply is not {REPLY_SHAPE}: {reason}; the reply: {reply}")]
    Shape { reason: String, reply: String },
}

/// A reply line as a [`RewardReply`], or what is wrong with it.
pub fn parse_reply(text: &str) -> Result<RewardReply, ReplyError> {
    let non_finite = ["NaN", "Infinity", "-Infinity", "inf", "nan"];
    match serde_json::from_str::<RewardReply>(text) {
        Ok(r) if r.reward.is_finite() => Ok(r),
        Ok(r) => Err(ReplyError::NotFinite { reward: r.reward, reply: quote(text) }),
        Err(e) => {
            let value = serde_json::from_str::<serde_json::Value>(text).ok();
            if value.is_none() && non_finite.iter().any(|t| text.contains(t)) {
                Err(ReplyError::NonFiniteLiteral { reply: quote(text) })
            } else {
                Err(ReplyError::Shape { reason: e.to_string(), reply: quote(text) })
            }
        }
    }
}
