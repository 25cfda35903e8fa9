//! The guard's ledger: what must hold across processes and resumes for the
//! guard's promises, in its own database (`guard.sqlite` in the workspace),
//! apart from the cache index: rollout claims (a rollout is consumed once),
//! single-use nonces (a validated batch updates parameters once), and the
//! sealed event chain of each lineage.
//!
//! Two backends behind one type. The executor opens the database
//! ([`Ledger::open`]); the worker never does: its ledger is [`Ledger::served`],
//! a channel to the executor that started it, which runs each request in its
//! own transaction on its own connection ([`super::served`]). So the only
//! writer of `guard.sqlite` is the process that owns the workspace, and the
//! guarantees (a rollout consumed once, a nonce spent once, a chain appended
//! in order) are SQLite's as before, whichever process asks.

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::store::index::db;
use crate::store::{open_database, open_database_read_only, while_locked, StoreError, Workspace};

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rollout_claims (
    lineage TEXT NOT NULL,
    rollout_id INTEGER NOT NULL,
    owner TEXT NOT NULL,
    PRIMARY KEY (lineage, rollout_id)
);
CREATE TABLE IF NOT EXISTS nonces (
    nonce TEXT PRIMARY KEY,
    batch_hash TEXT NOT NULL,
    policy_digest TEXT NOT NULL,
    spent INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS guard_events (
    lineage TEXT NOT NULL,
    seq INTEGER NOT NULL,
    producer TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    prev TEXT NOT NULL,
    seal TEXT NOT NULL,
    PRIMARY KEY (lineage, seq)
);
";

/// The ledger file in a workspace.
pub const FILE: &str = "guard.sqlite";

/// One event of a lineage's chain, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredEvent {
    pub seq: i64,
    pub producer: String,
    pub kind: String,
    /// Canonical JSON.
    pub payload: String,
    pub prev: String,
    pub seal: String,
}

/// The seal of an event: blake3 over the previous seal, its position, its
/// producer, its kind and its canonical payload. What links a chain.
pub fn seal(prev: &str, seq: i64, producer: &str, kind: &str, payload: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [prev, &seq.to_string(), producer, kind, payload] {
        h.update(part.as_bytes());
        h.update(b"\0");
    }
    h.finalize().to_hex().to_string()
}

/// A connection to a workspace's guard ledger. Each thread opens its own.
pub struct Ledger {
    backend: Backend,
}

enum Backend {
    Db(Connection),
    Served(RefCell<Channel>),
}

/// What a served ledger asks the executor: one request a line, one reply a
/// line, in order (the shared contract of both ends).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    ClaimRollouts { lineage: String, owner: String, ids: Vec<u64> },
    AppendEvent { lineage: String, producer: String, kind: String, payload: String },
    RestartChain { lineage: String, keep: usize },
    Events { lineage: String },
    RegisterNonce { nonce: String, batch_hash: String, policy_digest: String },
    ConsumeNonce { nonce: String },
}

/// The executor's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Done,
    Sealed {
        seal: String,
    },
    SetAside {
        aside: Option<String>,
    },
    Events {
        events: Vec<StoredEvent>,
    },
    Spent {
        spent: bool,
    },
    /// The request was refused or failed; nothing was changed.
    Refused {
        message: String,
    },
}

/// The largest line either end reads (a long run's chain of events, read
/// back whole for its summary, is a few MB).
pub const MAX_LINE_BYTES: u64 = 256 << 20;

/// Reads one line of at most [`MAX_LINE_BYTES`]; `None` at the end of the stream.
pub fn read_line(reader: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    let n = reader.by_ref().take(MAX_LINE_BYTES + 1).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') {
        let why = if n as u64 > MAX_LINE_BYTES { "longer than the limit" } else { "cut short" };
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a ledger line {why}")));
    }
    line.pop();
    Ok(Some(line))
}

/// The worker's end of a served ledger.
struct Channel {
    reader: BufReader<File>,
    writer: File,
}

impl Channel {
    fn call(&mut self, request: &Request) -> Result<Reply, StoreError> {
        let context = |what: &str| format!("the guard ledger's channel to the executor ({what})");
        let mut line = serde_json::to_vec(request).map_err(|e| StoreError::Invalid(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(|source| StoreError::Io { context: context("asking"), source })?;
        let reply = read_line(&mut self.reader)
            .map_err(|source| StoreError::Io { context: context("reading its reply"), source })?
            .ok_or_else(|| StoreError::Invalid(context("closed before it replied")))?;
        match serde_json::from_str(&reply) {
            Ok(Reply::Refused { message }) => Err(StoreError::Invalid(message)),
            Ok(reply) => Ok(reply),
            Err(e) => Err(StoreError::Invalid(format!("{}: {e}", context("a reply that does not read")))),
        }
    }
}

fn unexpected(reply: Reply) -> StoreError {
    StoreError::Invalid(format!("the guard ledger's executor answered out of turn: {reply:?}"))
}

impl Ledger {
    /// Opens (creating if needed) the ledger of a workspace.
    pub fn open(ws: &Workspace) -> Result<Ledger, StoreError> {
        if ws.is_read_only() {
            return Err(StoreError::Invalid(format!("the workspace {} is open read-only", ws.root().display())));
        }
        Self::open_at(&ws.root().join(FILE))
    }

    /// Opens (creating if needed) a ledger file. Creation (tables, journal mode)
    /// is serialized between processes that open a new one at the same moment.
    pub fn open_at(path: &Path) -> Result<Ledger, StoreError> {
        let conn = while_locked(&path.with_extension("lock"), || {
            open_database(path, "the guard ledger", SCHEMA, SCHEMA_VERSION)
        })?;
        Ok(Ledger { backend: Backend::Db(conn) })
    }

    /// A ledger served by the executor over a channel: requests written to
    /// `writer`, replies read from `reader` (the worker's stdin, a socket the
    /// executor holds the other end of).
    pub fn served(reader: BufReader<File>, writer: File) -> Ledger {
        Ledger { backend: Backend::Served(RefCell::new(Channel { reader, writer })) }
    }

    /// The ledger of a workspace for reading, or `None` if nothing was ever written to it.
    pub fn open_read_only(ws: &Workspace) -> Result<Option<Ledger>, StoreError> {
        let path = ws.root().join(FILE);
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Some(Ledger { backend: Backend::Db(open_database_read_only(&path, "the guard ledger")?) }))
    }

    /// Claims rollout ids of a lineage for `owner` (a node key), in one
    /// transaction: ids another owner already consumed are refused, so a rollout
    /// is never consumed twice, across processes and resumes. Re-claiming one's
    /// own ids (a retried node) is allowed.
    pub fn claim_rollouts(&mut self, lineage: &str, owner: &str, ids: &[u64]) -> Result<(), StoreError> {
        match &mut self.backend {
            Backend::Db(conn) => db_ops::claim_rollouts(conn, lineage, owner, ids),
            Backend::Served(ch) => {
                let request =
                    Request::ClaimRollouts { lineage: lineage.into(), owner: owner.into(), ids: ids.to_vec() };
                match ch.get_mut().call(&request)? {
                    Reply::Done => Ok(()),
                    other => Err(unexpected(other)),
                }
            }
        }
    }

    /// Appends a sealed event to a lineage's chain (in one transaction) and
    /// returns its seal ([`seal`] over the previous one).
    pub fn append_event(
        &mut self,
        lineage: &str,
        producer: &str,
        kind: &str,
        payload: &str,
    ) -> Result<String, StoreError> {
        match &mut self.backend {
            Backend::Db(conn) => db_ops::append_event(conn, lineage, producer, kind, payload),
            Backend::Served(ch) => {
                let request = Request::AppendEvent {
                    lineage: lineage.into(),
                    producer: producer.into(),
                    kind: kind.into(),
                    payload: payload.into(),
                };
                match ch.get_mut().call(&request)? {
                    Reply::Sealed { seal } => Ok(seal),
                    other => Err(unexpected(other)),
                }
            }
        }
    }

    /// Starts a lineage's chain over after its first `keep` events, for a
    /// new attempt: a deliberate re-run (`keep` 0), a crash recovery from a
    /// checkpoint or a resume from a state (`keep`: the events that
    /// checkpoint or state counted). Events past them belong to an attempt
    /// that is superseded: the whole chain is first copied, seals and all, to
    /// `LINEAGE~N` (the first free N), where it stays verifiable, and only then
    /// cut back, in one transaction. Returns that name, or `None` when the
    /// chain held no more than `keep` events. Rollout claims are untouched: a
    /// re-run of the same node key claims its own rollouts again.
    pub fn restart_chain(&mut self, lineage: &str, keep: usize) -> Result<Option<String>, StoreError> {
        match &mut self.backend {
            Backend::Db(conn) => db_ops::restart_chain(conn, lineage, keep),
            Backend::Served(ch) => match ch.get_mut().call(&Request::RestartChain { lineage: lineage.into(), keep })? {
                Reply::SetAside { aside } => Ok(aside),
                other => Err(unexpected(other)),
            },
        }
    }

    /// A lineage's events in stored order.
    pub fn events(&self, lineage: &str) -> Result<Vec<StoredEvent>, StoreError> {
        match &self.backend {
            Backend::Db(conn) => db_ops::events(conn, lineage),
            Backend::Served(ch) => match ch.borrow_mut().call(&Request::Events { lineage: lineage.into() })? {
                Reply::Events { events } => Ok(events),
                other => Err(unexpected(other)),
            },
        }
    }

    /// Direct access for the unit tests that tamper with the log; not part of the API.
    #[cfg(test)]
    pub(crate) fn execute_raw(&self, sql: &str) -> Result<usize, StoreError> {
        match &self.backend {
            Backend::Db(conn) => conn.execute(sql, []).map_err(db("raw statement")),
            Backend::Served(_) => Err(StoreError::Invalid("a served ledger runs no raw statement".into())),
        }
    }

    /// Records a freshly minted nonce (unspent).
    pub fn register_nonce(&self, nonce: &str, batch_hash: &str, policy_digest: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Db(conn) => db_ops::register_nonce(conn, nonce, batch_hash, policy_digest),
            Backend::Served(ch) => {
                let request = Request::RegisterNonce {
                    nonce: nonce.into(),
                    batch_hash: batch_hash.into(),
                    policy_digest: policy_digest.into(),
                };
                match ch.borrow_mut().call(&request)? {
                    Reply::Done => Ok(()),
                    other => Err(unexpected(other)),
                }
            }
        }
    }

    /// Spends a nonce: true for the one caller that flips it, false for everyone
    /// else (also across processes: one conditional UPDATE, atomic in SQLite).
    pub fn consume_nonce(&mut self, nonce: &str) -> Result<bool, StoreError> {
        match &mut self.backend {
            Backend::Db(conn) => db_ops::consume_nonce(conn, nonce),
            Backend::Served(ch) => match ch.get_mut().call(&Request::ConsumeNonce { nonce: nonce.into() })? {
                Reply::Spent { spent } => Ok(spent),
                other => Err(unexpected(other)),
            },
        }
    }
}

/// The database backend's statements.
mod db_ops {
    use super::*;

    /// Claims rollout ids of a lineage for `owner` (a node key), in one
    /// transaction: ids another owner already consumed are refused, so a rollout
    /// is never consumed twice, across processes and resumes. Re-claiming one's
    /// own ids (a retried node) is allowed.
    pub(super) fn claim_rollouts(
        conn: &mut Connection,
        lineage: &str,
        owner: &str,
        ids: &[u64],
    ) -> Result<(), StoreError> {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db("claiming rollouts"))?;
        {
            let mut get = tx
                .prepare_cached("SELECT owner FROM rollout_claims WHERE lineage = ?1 AND rollout_id = ?2")
                .map_err(db("claiming rollouts"))?;
            let mut put = tx
                .prepare_cached("INSERT OR IGNORE INTO rollout_claims (lineage, rollout_id, owner) VALUES (?1, ?2, ?3)")
                .map_err(db("claiming rollouts"))?;
            for &id in ids {
                let existing: Option<String> = get
                    .query_row(params![lineage, id as i64], |r| r.get(0))
                    .optional()
                    .map_err(db("claiming rollouts"))?;
                match existing {
                    Some(o) if o != owner => {
                        return Err(StoreError::Invalid(format!(
                            "rollout {id} of lineage {} was already consumed by node key {}: a rollout is never consumed twice",
                            crate::ids::short(lineage),
                            crate::ids::short(&o)
                        )))
                    }
                    Some(_) => {}
                    None => {
                        put.execute(params![lineage, id as i64, owner]).map_err(db("claiming rollouts"))?;
                    }
                }
            }
        }
        tx.commit().map_err(db("claiming rollouts"))
    }

    /// Appends a sealed event to a lineage's chain (in one transaction) and returns its seal.
    pub(super) fn append_event(
        conn: &mut Connection,
        lineage: &str,
        producer: &str,
        kind: &str,
        payload: &str,
    ) -> Result<String, StoreError> {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db("appending an event"))?;
        let last: Option<(i64, String)> = tx
            .query_row(
                "SELECT seq, seal FROM guard_events WHERE lineage = ?1 ORDER BY seq DESC LIMIT 1",
                params![lineage],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(db("appending an event"))?;
        let (seq, prev) = last.map(|(s, seal)| (s + 1, seal)).unwrap_or((1, "genesis".to_string()));
        let seal = super::seal(&prev, seq, producer, kind, payload);
        tx.execute(
            "INSERT INTO guard_events (lineage, seq, producer, kind, payload, prev, seal) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![lineage, seq, producer, kind, payload, prev, seal],
        )
        .map_err(db("appending an event"))?;
        tx.commit().map_err(db("appending an event"))?;
        Ok(seal)
    }

    /// Starts a lineage's chain over after its first `keep` events, for a
    /// new attempt: a deliberate re-run (`keep` 0), a crash recovery from a
    /// checkpoint or a resume from a state (`keep`: the events that
    /// checkpoint or state counted). Events past them belong to an attempt
    /// that is superseded: the whole chain is first copied, seals and all, to
    /// `LINEAGE~N` (the first free N), where it stays verifiable, and only then
    /// cut back, in one transaction. Returns that name, or `None` when the
    /// chain held no more than `keep` events. Rollout claims are untouched: a
    /// re-run of the same node key claims its own rollouts again.
    pub(super) fn restart_chain(
        conn: &mut Connection,
        lineage: &str,
        keep: usize,
    ) -> Result<Option<String>, StoreError> {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db("starting a lineage over"))?;
        let past: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM guard_events WHERE lineage = ?1 AND seq > ?2",
                params![lineage, keep as i64],
                |r| r.get(0),
            )
            .map_err(db("starting a lineage over"))?;
        if past == 0 {
            return Ok(None);
        }
        let mut n = 1;
        let aside = loop {
            let name = format!("{lineage}~{n}");
            let taken: bool = tx
                .query_row("SELECT EXISTS (SELECT 1 FROM guard_events WHERE lineage = ?1)", params![name], |r| r.get(0))
                .map_err(db("starting a lineage over"))?;
            if !taken {
                break name;
            }
            n += 1;
        };
        tx.execute(
            "INSERT INTO guard_events (lineage, seq, producer, kind, payload, prev, seal)
             SELECT ?2, seq, producer, kind, payload, prev, seal FROM guard_events WHERE lineage = ?1 ORDER BY rowid",
            params![lineage, aside],
        )
        .map_err(db("setting a superseded attempt aside"))?;
        tx.execute("DELETE FROM guard_events WHERE lineage = ?1 AND seq > ?2", params![lineage, keep as i64])
            .map_err(db("starting a lineage over"))?;
        tx.commit().map_err(db("starting a lineage over"))?;
        Ok(Some(aside))
    }

    /// A lineage's events in stored order.
    pub(super) fn events(conn: &Connection, lineage: &str) -> Result<Vec<StoredEvent>, StoreError> {
        let mut stmt = conn
            .prepare(
                "SELECT seq, producer, kind, payload, prev, seal FROM guard_events WHERE lineage = ?1 ORDER BY rowid",
            )
            .map_err(db("reading events"))?;
        let rows = stmt
            .query_map(params![lineage], |r| {
                Ok(StoredEvent {
                    seq: r.get(0)?,
                    producer: r.get(1)?,
                    kind: r.get(2)?,
                    payload: r.get(3)?,
                    prev: r.get(4)?,
                    seal: r.get(5)?,
                })
            })
            .map_err(db("reading events"))?;
        rows.collect::<Result<_, _>>().map_err(db("reading events"))
    }

    /// Records a freshly minted nonce (unspent).
    pub(super) fn register_nonce(
        conn: &Connection,
        nonce: &str,
        batch_hash: &str,
        policy_digest: &str,
    ) -> Result<(), StoreError> {
        conn.execute(
            "INSERT INTO nonces (nonce, batch_hash, policy_digest) VALUES (?1, ?2, ?3)",
            params![nonce, batch_hash, policy_digest],
        )
        .map_err(db("registering a nonce"))?;
        Ok(())
    }

    /// Spends a nonce: true for the one caller that flips it, false for everyone
    /// else (also across processes: one conditional UPDATE, atomic in SQLite).
    pub(super) fn consume_nonce(conn: &Connection, nonce: &str) -> Result<bool, StoreError> {
        let changed = conn
            .execute("UPDATE nonces SET spent = 1 WHERE nonce = ?1 AND spent = 0", params![nonce])
            .map_err(db("spending a nonce"))?;
        Ok(changed == 1)
    }
}
