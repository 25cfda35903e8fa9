//! What every network read shares: timeouts, a guard on stalled bodies, and
//! retries with capped exponential backoff and jitter.
//!
//! | limit | default | set by |
//! |---|---|---|
//! | connect | 10 s | `ORCHESTRATE_CONNECT_TIMEOUT` (seconds) |
//! | first byte of an answer (headers) | 10 s Hub, 60 s S3 | `HF_HUB_DOWNLOAD_TIMEOUT` (as `huggingface_hub`), `ORCHESTRATE_S3_TIMEOUT` |
//! | a body silent for | the same | the same |
//! | a body slower than 1 KiB per that window (a trickle) | | |
//! | attempts | 5 Hub (as `huggingface_hub`), 3 S3 (the AWS SDKs' standard mode) | |
//!
//! ureq bounds connecting and waiting for headers, but only the whole of a
//! body, which a large download cannot be given. So a body is read by a
//! thread of its own, and [`StallGuard`] gives up on it once it has been
//! silent, or has delivered under [`LOW_SPEED_BYTES`], for a whole window:
//! curl's `--speed-limit`/`--speed-time`. The abandoned thread ends with
//! the connection (the agent's overall limit closes it).

use std::io::{self, Read};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A body delivering fewer bytes than this in a whole window is stalled.
pub const LOW_SPEED_BYTES: u64 = 1024;

/// An environment variable whose value is not what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value}: expected {expected}")]
pub struct EnvVarError {
    pub name: String,
    /// As set (quoted where that shows what was there).
    pub value: String,
    pub expected: String,
}

/// Seconds from an environment variable (a positive number), else `default`.
pub fn seconds_from_env(name: &str, default: Duration) -> Result<Duration, EnvVarError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(EnvVarError {
                name: name.to_string(),
                value: v,
                expected: "a number of seconds above 0 (at most 86400)".into(),
            }),
        },
        _ => Ok(default),
    }
}

/// The connect limit every client uses.
pub fn connect_timeout() -> Result<Duration, EnvVarError> {
    seconds_from_env("ORCHESTRATE_CONNECT_TIMEOUT", Duration::from_secs(10))
}

/// How long to wait before attempt `attempt` (1 for the first retry): full
/// jitter over a doubling base, capped, as the AWS SDKs' standard mode does.
pub fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let ceiling = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let seed = blake3::hash(format!("{nanos}-{}-{attempt}", std::process::id()).as_bytes());
    let unit = u64::from_le_bytes(seed.as_bytes()[..8].try_into().expect("8 bytes")) as f64 / u64::MAX as f64;
    // At least a tenth of the ceiling, so retries never come all at once.
    ceiling.mul_f64(0.1 + 0.9 * unit)
}

/// A body read on a thread of its own, given up once it stalls (see the module doc).
pub struct StallGuard {
    chunks: Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    at: usize,
    window: Duration,
    window_start: Instant,
    window_bytes: u64,
    ended: bool,
}

impl StallGuard {
    pub fn new(mut body: impl Read + Send + 'static, window: Duration) -> StallGuard {
        let (tx, rx) = mpsc::sync_channel(4);
        std::thread::spawn(move || loop {
            let mut chunk = vec![0u8; 1 << 16];
            match body.read(&mut chunk) {
                Ok(n) => {
                    chunk.truncate(n);
                    if tx.send(Ok(chunk)).is_err() || n == 0 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    break;
                }
            }
        });
        StallGuard {
            chunks: rx,
            current: Vec::new(),
            at: 0,
            window,
            window_start: Instant::now(),
            window_bytes: 0,
            ended: false,
        }
    }

    fn stalled(&self, how: &str) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, format!("{how} (limit {:.0} s)", self.window.as_secs_f64()))
    }
}

impl Read for StallGuard {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            if self.ended {
                return Ok(0);
            }
            let elapsed = self.window_start.elapsed();
            if elapsed >= self.window {
                if self.window_bytes < LOW_SPEED_BYTES {
                    return Err(self.stalled(&format!(
                        "the body trickled {} bytes in {:.0} s",
                        self.window_bytes,
                        elapsed.as_secs_f64()
                    )));
                }
                self.window_start = Instant::now();
                self.window_bytes = 0;
            }
            match self.chunks.recv_timeout(self.window) {
                Ok(Ok(chunk)) if chunk.is_empty() => self.ended = true,
                Ok(Ok(chunk)) => {
                    self.window_bytes += chunk.len() as u64;
                    self.current = chunk;
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => return Err(self.stalled("no byte of the body arrived")),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the body's reader ended"))
                }
            }
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields its bytes one at a time, sleeping before each.
    struct Slow {
        left: usize,
        pause: Duration,
    }

    impl Read for Slow {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.left == 0 {
                return Ok(0);
            }
            std::thread::sleep(self.pause);
            self.left -= 1;
            out[0] = b'x';
            Ok(1)
        }
    }

    #[test]
    fn a_silent_body_and_a_trickle_are_given_up_and_a_steady_one_is_read_whole() {
        let window = Duration::from_millis(300);
        let start = Instant::now();
        let mut silent = StallGuard::new(Slow { left: 1, pause: Duration::from_secs(5) }, window);
        let err = silent.read_to_end(&mut Vec::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
        let mut trickle = StallGuard::new(Slow { left: 1000, pause: Duration::from_millis(20) }, window);
        let err = trickle.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("trickled"), "{err}");
        let mut whole = Vec::new();
        StallGuard::new(io::Cursor::new(vec![7u8; 200_000]), window).read_to_end(&mut whole).unwrap();
        assert_eq!(whole, vec![7u8; 200_000]);
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_below_the_ceiling() {
        let (base, cap) = (Duration::from_millis(100), Duration::from_secs(2));
        for attempt in 0..10 {
            let d = backoff(attempt, base, cap);
            let ceiling = base.saturating_mul(1 << attempt).min(cap);
            assert!(d <= ceiling && d >= ceiling / 10, "attempt {attempt}: {d:?}");
        }
    }

    #[test]
    fn a_timeout_from_the_environment_is_checked() {
        assert_eq!(
            seconds_from_env("ORCHESTRATE_TEST_UNSET_TIMEOUT", Duration::from_secs(3)),
            Ok(Duration::from_secs(3))
        );
    }
}
