//! The SQLite index (WAL mode): node key → outputs and the record that made the
//! key, plus runs, their nodes and their events, and a stat cache for hashing.

use super::Key;
use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::history::{self, PendingRun};
use super::objects::ObjectInfo;
use super::StoreError;

/// `stat` facts of a file in the user's tree, used only to skip re-hashing an
/// unchanged file; never part of a key. What git's index compares: size,
/// mtime, ctime and inode. The ctime cannot be set back by a user (`touch -d`
/// and `utimes` restore an mtime, and change the ctime), so an in-place edit
/// that keeps the size and restores the mtime is still seen. Any difference
/// means "hash the file", never "changed".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub size: u64,
    pub mtime_ns: i64,
    /// `None` in records written before it was kept: they never match, so the
    /// file is hashed once and the record refreshed.
    #[serde(default)]
    pub ctime_ns: Option<i64>,
    pub ino: u64,
}

impl FileStat {
    pub fn of(path: &Path) -> std::io::Result<FileStat> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(FileStat {
            size: m.len(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: Some(m.ctime() * 1_000_000_000 + m.ctime_nsec()),
            ino: m.ino(),
        })
    }
}

/// One published output of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub name: String,
    #[serde(flatten)]
    pub object: ObjectInfo,
    /// For outputs that live in the user's tree: the path relative to the spec's
    /// folder and the stat it had when published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stat: Option<FileStat>,
    /// Set when `gc --drop-states` removed this output's object while its
    /// node stays cached (its hash still keys what read it): when and why. A
    /// run that needs the bytes again runs the node first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<String>,
}

impl OutputRecord {
    /// Whether its object is meant to be in the store (not dropped by gc).
    pub fn stored(&self) -> bool {
        self.dropped.is_none()
    }
}

/// A completed node in the cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CachedNode {
    pub key: Key,
    pub node_id: String,
    pub spec: String,
    /// The record the key was computed from (its key is `record.key()`).
    pub record: crate::record::HashInputs,
    pub outputs: Vec<OutputRecord>,
    pub seconds: f64,
    pub finished_at: String,
    pub run_id: String,
    /// What the op's process cost (seconds, memory), as it measured them:
    /// beside the outputs, never hashed and never signed (`None`: an op that
    /// measures none, or a record from before they were kept here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<crate::costs::NodeCosts>,
}

impl CachedNode {
    /// The paths (relative to the spec's folder) of the outputs recorded in
    /// the user's tree: a shell node's `outs`.
    pub fn tree_outs(&self) -> impl Iterator<Item = &String> {
        self.outputs.iter().filter_map(|o| o.workspace_path.as_ref())
    }
}

/// Which spec (by name) and profile a lookup is about.
#[derive(Debug, Clone, Copy)]
pub struct SpecRef<'a> {
    pub name: &'a str,
    pub profile: Option<&'a str>,
}

/// A run as listed by `orchestrate status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRow {
    pub run_id: String,
    pub spec: String,
    pub profile: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: String,
    pub summary: Option<String>,
}

/// How a node ended in one run: the one vocabulary of the index, the Slurm
/// result files, `status`, `events` and the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeOutcome {
    /// Served from the cache.
    Cached,
    /// Executed, and its outputs published.
    Ran,
    /// Executed, and failed.
    Failed,
    /// Not executed, because something it needs failed.
    Skipped,
}

impl NodeOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            NodeOutcome::Cached => "cached",
            NodeOutcome::Ran => "ran",
            NodeOutcome::Failed => "failed",
            NodeOutcome::Skipped => "skipped",
        }
    }

    /// Parses a stored outcome; anything else is not an outcome.
    pub fn parse(text: &str) -> Option<Self> {
        [NodeOutcome::Cached, NodeOutcome::Ran, NodeOutcome::Failed, NodeOutcome::Skipped]
            .into_iter()
            .find(|o| o.as_str() == text)
    }
}

impl std::fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl rusqlite::types::ToSql for NodeOutcome {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl rusqlite::types::FromSql for NodeOutcome {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let text = value.as_str()?;
        NodeOutcome::parse(text).ok_or_else(|| {
            rusqlite::types::FromSqlError::Other(
                format!("'{text}' is not a node outcome (cached, ran, failed, skipped)").into(),
            )
        })
    }
}

/// A node's outcome in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunNodeRow {
    pub node_id: String,
    pub key: Option<Key>,
    pub outcome: NodeOutcome,
    pub seconds: Option<f64>,
    pub detail: Option<String>,
    /// The outputs the node had in this run (ran or cached): the objects that
    /// held its bytes then. A later `run --force` of the same key may store
    /// other bytes in its cache row; what this run made and was judged on is
    /// read from here. `None`: failed or skipped, or a run recorded before
    /// runs kept their outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<RunOutput>>,
}

impl RunNodeRow {
    /// The outputs the node had in this run: those the run recorded (a later
    /// `run --force` of the same key may have stored other bytes in its cache
    /// row), or, for a run recorded before runs kept them, `cached`, its key's
    /// cache row. A node that failed or was skipped had none.
    pub fn outputs_had(&self, cached: Option<&CachedNode>) -> Vec<RunOutput> {
        match (&self.outputs, self.outcome) {
            (Some(outputs), _) => outputs.clone(),
            (None, NodeOutcome::Ran | NodeOutcome::Cached) => cached
                .map(|c| c.outputs.iter().filter(|o| o.stored()).map(RunOutput::from).collect())
                .unwrap_or_default(),
            (None, _) => Vec::new(),
        }
    }
}

/// An output as a run had it: its name and its object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutput {
    pub name: String,
    #[serde(flatten)]
    pub object: ObjectInfo,
}

impl From<&OutputRecord> for RunOutput {
    fn from(o: &OutputRecord) -> RunOutput {
        RunOutput { name: o.name.clone(), object: o.object.clone() }
    }
}

/// 6: `nodes.costs` (added to an older index's table by [`Index::open`]).
const SCHEMA_VERSION: i64 = 6;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS nodes (
    key TEXT PRIMARY KEY,
    node_id TEXT NOT NULL,
    spec TEXT NOT NULL,
    record TEXT NOT NULL,
    outputs TEXT NOT NULL,
    seconds REAL NOT NULL,
    finished_at TEXT NOT NULL,
    run_id TEXT NOT NULL,
    costs TEXT
);
CREATE INDEX IF NOT EXISTS nodes_by_id ON nodes(node_id, finished_at);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    profile TEXT,
    argv TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS run_nodes (
    run_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    key TEXT,
    outcome TEXT NOT NULL,
    seconds REAL,
    detail TEXT,
    outputs TEXT,
    PRIMARY KEY (run_id, node_id)
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- Version 5 keeps the ctime: the stat cache of older versions is dropped
-- (it only saves hashing; every file is hashed once again).
DROP TABLE IF EXISTS file_stats;
CREATE TABLE file_stats (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    hash TEXT NOT NULL
);
";

/// Whether a cache row has a dropped output (its outputs' JSON names the
/// field): the very condition of the partial index `nodes_dropped`, so that
/// SQLite reads that index, which holds only such rows.
const DROPPED_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS nodes_dropped ON nodes(key) WHERE outputs LIKE '%\"dropped\"%';";

const ANY_DROPPED: &str = "SELECT EXISTS(SELECT 1 FROM nodes WHERE outputs LIKE '%\"dropped\"%')";

/// A cache row as read: key, node id, spec, record, outputs, seconds, finished at, run id.
type CachedRow = (String, String, String, String, String, f64, String, String, Option<String>);

/// A connection to the index. Each thread opens its own.
pub struct Index {
    conn: Connection,
    /// The file opened and its identity (device, inode) then, to notice a
    /// file removed or replaced under an open connection, which SQLite goes on
    /// writing into unseen.
    file: Option<(std::path::PathBuf, u64, u64)>,
    /// The columns a cache row is read from: an index of version 5 or older
    /// opened read-only has no `costs` column, and reads none.
    columns: &'static str,
    /// Whether `run_nodes` has its `outputs` column (an older index opened
    /// read-only may not: its runs read as having recorded none).
    run_outputs: bool,
    /// Whether reads share one transaction ([`Index::batch_reads`]) and it is open.
    batch: std::cell::Cell<bool>,
    /// The runs of hits alone not folded in yet ([`super::history`]): read
    /// with the history, written only where `defer_history`.
    history: std::path::PathBuf,
    /// Whether a run of hits alone is appended there (WAL mode) rather than
    /// committed here.
    defer_history: bool,
}

fn insert_run(conn: &Connection, run: &RunRow, argv: &str) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO runs (run_id, spec, profile, argv, pid, started_at, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![run.run_id, run.spec, run.profile, argv, std::process::id(), run.started_at, run.status],
    )
    .map_err(db("recording a run"))?;
    Ok(())
}

/// A run's node outcomes and events.
fn insert_outcomes(
    conn: &Connection,
    run_id: &str,
    nodes: &[RunNodeRow],
    events: &[(u64, String)],
) -> Result<(), StoreError> {
    let mut ins = conn
        .prepare_cached(
            "INSERT OR REPLACE INTO run_nodes (run_id, node_id, key, outcome, seconds, detail, outputs)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(db("recording run nodes"))?;
    for n in nodes {
        ins.execute(params![run_id, n.node_id, n.key, n.outcome, n.seconds, n.detail, n.outputs.as_ref().map(json)])
            .map_err(db("recording run nodes"))?;
    }
    let mut ev = conn
        .prepare_cached("INSERT OR REPLACE INTO events (run_id, seq, event) VALUES (?1, ?2, ?3)")
        .map_err(db("recording events"))?;
    for (seq, e) in events {
        ev.execute(params![run_id, *seq as i64, e]).map_err(db("recording events"))?;
    }
    Ok(())
}

/// Whether the partial index of rows with a dropped output is there.
fn has_dropped_index(conn: &Connection) -> Result<bool, StoreError> {
    conn.prepare_cached("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'nodes_dropped'")
        .and_then(|mut s| s.exists([]))
        .map_err(db("looking for the index of dropped outputs"))
}

/// Whether the nodes table has the `costs` column (index version 6).
fn has_costs_column(conn: &Connection) -> Result<bool, StoreError> {
    has_column(conn, "nodes", "costs")
}

/// Whether the run_nodes table has the `outputs` column (added in version 6
/// when runs began to keep the outputs they had).
fn has_run_outputs_column(conn: &Connection) -> Result<bool, StoreError> {
    has_column(conn, "run_nodes", "outputs")
}

fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")
        .and_then(|mut s| s.exists(params![table, column]))
        .map_err(db("reading a table's columns"))
}

fn file_identity(path: &Path) -> Option<(std::path::PathBuf, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (path.to_path_buf(), m.dev(), m.ino()))
}

/// Names what was being done when SQLite failed.
pub(crate) fn db(context: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |error| StoreError::Db { context: context.to_string(), error }
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("index rows serialize")
}

fn parse<T: for<'de> Deserialize<'de>>(text: &str, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Invalid(format!("corrupt {what} in the index: {e}")))
}

/// Filesystems whose files are shared between hosts (statfs `f_type`): NFS,
/// SMB/CIFS, Lustre, GPFS, BeeGFS, CephFS, AFS, 9p and FUSE (sshfs, JuiceFS, ...).
const NETWORK_FS: &[i64] = &[
    0x6969,
    0x517B,
    0xFF53_4D42,
    0xFE53_4D42,
    0x0BD0_0BD0,
    0x4750_4653,
    0x1983_0326,
    0x00C3_6400,
    0x5346_414F,
    0x0102_1997,
    0x6573_5546,
];

/// `WAL` on a local filesystem, `DELETE` (the rollback journal) on a network
/// one; `ORCHESTRATE_SQLITE_JOURNAL=wal|delete` decides instead.
pub fn journal_mode_for(db_path: &Path) -> Result<&'static str, StoreError> {
    match std::env::var("ORCHESTRATE_SQLITE_JOURNAL").ok().as_deref() {
        None | Some("") => {}
        Some(v) if v.eq_ignore_ascii_case("wal") => return Ok("WAL"),
        Some(v) if v.eq_ignore_ascii_case("delete") => return Ok("DELETE"),
        Some(other) => {
            return Err(StoreError::Invalid(format!("ORCHESTRATE_SQLITE_JOURNAL={other}: expected wal or delete")))
        }
    }
    let dir = db_path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok(if on_network_fs(dir) { "DELETE" } else { "WAL" })
}

fn on_network_fs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    // f_type is signed on some targets; compare the low 32 bits.
    NETWORK_FS.contains(&((st.f_type as i64) & 0xFFFF_FFFF))
}

/// Opens (and if needed creates) one of the workspace's SQLite databases, shared
/// by every process of the workspace: a 60 s busy timeout, the journal mode
/// [`journal_mode_for`] picks, and `schema` applied when the file's
/// `user_version` is older than `version` (a newer one is refused). Other
/// modules keep their own tables this way (the guard's ledger).
pub fn open_database(path: &Path, what: &str, schema: &str, version: i64) -> Result<Connection, StoreError> {
    open_checked(path, what, schema, version).map_err(|e| match e {
        StoreError::Db { error, .. } if is_damage(&error) => StoreError::Damaged {
            path: path.to_path_buf(),
            detail: error.to_string(),
            advice: if what == "the index" {
                "Then `orchestrate reindex` rebuilds its cache rows from the node records under records/, \
                 re-hashing every object, so no node that completed runs again; the history of runs, their \
                 events and the stat cache are lost (a node completed before records were kept runs again)."
            } else {
                "What it recorded (the guard's rollout claims, nonces and sealed events) is lost with it; GRPO \
                 nodes that need it run again."
            },
        },
        other => other,
    })
}

/// Opens an existing database of the workspace read-only (changes nothing), with
/// the same busy timeout as [`open_database`].
pub fn open_database_read_only(path: &Path, what: &str) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|error| StoreError::Db { context: format!("opening {what} {} read-only", path.display()), error })?;
    conn.busy_timeout(Duration::from_secs(60)).map_err(db("setting busy timeout"))?;
    Ok(conn)
}

/// SQLite's "this file is not a (sound) database": corruption, or not a database at all.
fn is_damage(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) | Some(rusqlite::ErrorCode::NotADatabase)
    )
}

fn open_checked(path: &Path, what: &str, schema: &str, version: i64) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)
        .map_err(|error| StoreError::Db { context: format!("opening {what} {}", path.display()), error })?;
    conn.busy_timeout(Duration::from_secs(60)).map_err(db("setting busy timeout"))?;
    // Every statement a node runs is prepared once per connection (rusqlite
    // keeps 16 by default; the index has about as many).
    conn.set_prepared_statement_cache_capacity(32);
    // WAL: readers never block the writer; NORMAL: a killed process loses
    // nothing committed (only power loss could drop the last commits).
    // WAL needs memory shared by every process using the database, so on a
    // network filesystem (Slurm jobs on several hosts) the rollback journal
    // is used instead, with FULL sync; it relies only on POSIX locks.
    let want = journal_mode_for(path)?;
    let mode: String =
        conn.pragma_query_value(None, "journal_mode", |r| r.get(0)).map_err(db("reading journal mode"))?;
    if !mode.eq_ignore_ascii_case(want) {
        // Switching modes takes an exclusive lock; callers serialize first opens (Workspace::open).
        conn.pragma_update(None, "journal_mode", want).map_err(db("setting the journal mode"))?;
    }
    let sync = if want == "WAL" { "NORMAL" } else { "FULL" };
    conn.pragma_update(None, "synchronous", sync).map_err(db("setting synchronous"))?;
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(db("reading version"))?;
    if found > version {
        return Err(StoreError::Invalid(format!(
            "{} was written by a newer orchestrate ({what} version {found}, this one knows {version})",
            path.display()
        )));
    }
    if found < version {
        conn.execute_batch(schema).map_err(db("creating tables"))?;
        conn.pragma_update(None, "user_version", version).map_err(db("setting version"))?;
    }
    Ok(conn)
}

impl Index {
    /// Opens (and if needed creates) the index.
    pub fn open(path: &Path) -> Result<Index, StoreError> {
        let conn = open_database(path, "the index", SCHEMA, SCHEMA_VERSION)?;
        // An index of version 5 or older has no `costs` column (CREATE TABLE
        // IF NOT EXISTS kept its table as it was).
        if !has_costs_column(&conn)? {
            conn.execute_batch("ALTER TABLE nodes ADD COLUMN costs TEXT").map_err(db("adding the costs column"))?;
        }
        // Nor, before runs kept their outputs, the run_nodes `outputs` column.
        if !has_run_outputs_column(&conn)? {
            conn.execute_batch("ALTER TABLE run_nodes ADD COLUMN outputs TEXT")
                .map_err(db("adding the run outputs column"))?;
        }
        // An index of version 6 made before the partial index of
        // [`ANY_DROPPED`] was part of the schema gains it (building it reads
        // every row once).
        if !has_dropped_index(&conn)? {
            conn.execute_batch(DROPPED_INDEX).map_err(db("adding the index of dropped outputs"))?;
        }
        let defer_history = journal_mode_for(path)? == "WAL";
        Ok(Index {
            conn,
            file: file_identity(path),
            columns: Self::COLUMNS,
            run_outputs: true,
            batch: Default::default(),
            history: history::path_for(path),
            defer_history,
        })
    }

    /// Whether the file this connection writes is still the one at its path:
    /// an index removed (or replaced) while a run had it open is an error
    /// saying how to recover, not writes into a file nobody will read.
    pub fn check_still_linked(&self) -> Result<(), StoreError> {
        let Some((path, dev, ino)) = &self.file else {
            return Ok(());
        };
        if file_identity(path).is_some_and(|(_, d, i)| (d, i) == (*dev, *ino)) {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "the index {} was removed or replaced while this run had it open; what this run finished \
             is in the workspace's records: run `orchestrate reindex` to index it again",
            path.display()
        )))
    }

    /// Opens an existing index read-only (for `plan`, `--dry-run`: changes nothing).
    pub fn open_read_only(path: &Path) -> Result<Index, StoreError> {
        let conn = open_database_read_only(path, "the index")?;
        let columns = if has_costs_column(&conn)? { Self::COLUMNS } else { Self::COLUMNS_BEFORE_COSTS };
        let run_outputs = has_run_outputs_column(&conn)?;
        Ok(Index {
            conn,
            file: file_identity(path),
            columns,
            run_outputs,
            batch: Default::default(),
            history: history::path_for(path),
            defer_history: false,
        })
    }

    /// Lets the reads that follow share one read transaction, until
    /// [`Index::end_reads`] or a write: a burst of cache hits then takes
    /// SQLite's shared lock once instead of once per read (in a 200-node
    /// no-op, about 400 `fcntl` calls). They read one snapshot, so the caller
    /// ends the batch before it waits for anything: a snapshot kept would
    /// hide later commits and hold back checkpoints. A write ends the batch
    /// first rather than upgrade the snapshot, which fails once another
    /// connection has committed since it began.
    pub fn batch_reads(&self) -> Result<(), StoreError> {
        if !self.batch.get() {
            self.conn
                .prepare_cached("BEGIN DEFERRED")
                .and_then(|mut s| s.execute([]))
                .map_err(db("starting a read transaction"))?;
            self.batch.set(true);
        }
        Ok(())
    }

    /// Ends the reads' shared transaction, if one is open.
    pub fn end_reads(&self) -> Result<(), StoreError> {
        if self.batch.replace(false) && !self.conn.is_autocommit() {
            self.conn
                .prepare_cached("COMMIT")
                .and_then(|mut s| s.execute([]))
                .map_err(db("ending a read transaction"))?;
        }
        Ok(())
    }

    fn row_to_cached(row: &rusqlite::Row<'_>) -> rusqlite::Result<CachedRow> {
        Ok((
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
            row.get(5)?,
            row.get(6)?,
            row.get(7)?,
            row.get(8)?,
        ))
    }

    fn cached(raw: CachedRow) -> Result<CachedNode, StoreError> {
        let (key, node_id, spec, record, outputs, seconds, finished_at, run_id, costs) = raw;
        Ok(CachedNode {
            costs: costs.as_deref().map(|c| parse(c, "costs")).transpose()?,
            record: parse(&record, "hash-input record")?,
            outputs: parse(&outputs, "outputs manifest")?,
            key: Key::parse(&key)?,
            node_id,
            spec,
            seconds,
            finished_at,
            run_id,
        })
    }

    const COLUMNS: &'static str = "key, node_id, spec, record, outputs, seconds, finished_at, run_id, costs";
    const COLUMNS_BEFORE_COSTS: &'static str =
        "key, node_id, spec, record, outputs, seconds, finished_at, run_id, NULL AS costs";

    /// The outputs of every cached result of node `node_id` of spec `spec`
    /// (whatever its key): what a copy of that node's data could hold.
    pub fn outputs_of_node(&self, spec: &str, node_id: &str) -> Result<Vec<OutputRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT outputs FROM nodes WHERE spec = ?1 AND node_id = ?2")
            .map_err(db("listing a node's results"))?;
        let rows = stmt
            .query_map(params![spec, node_id], |r| r.get::<_, String>(0))
            .map_err(db("listing a node's results"))?
            .collect::<Result<Vec<String>, _>>()
            .map_err(db("listing a node's results"))?;
        let mut out = Vec::new();
        for text in rows {
            out.extend(parse::<Vec<OutputRecord>>(&text, "outputs manifest")?);
        }
        Ok(out)
    }

    pub fn lookup(&self, key: &str) -> Result<Option<CachedNode>, StoreError> {
        let raw = self
            .conn
            .prepare_cached(&format!("SELECT {} FROM nodes WHERE key = ?1", self.columns))
            .and_then(|mut s| s.query_row(params![key], Self::row_to_cached).optional())
            .map_err(db("looking up a key"))?;
        raw.map(Self::cached).transpose()
    }

    /// A cached key's outputs manifest alone: what deciding a cache hit
    /// needs. The hash-input record (the larger part of a row) is neither
    /// read nor decoded; [`Index::lookup`] reads the whole row.
    pub fn lookup_outputs(&self, key: &str) -> Result<Option<Vec<OutputRecord>>, StoreError> {
        let raw: Option<String> = self
            .conn
            .prepare_cached("SELECT outputs FROM nodes WHERE key = ?1")
            .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
            .map_err(db("looking up a key's outputs"))?;
        raw.map(|text| parse(&text, "outputs manifest")).transpose()
    }

    /// What a cached key's process cost, alone (`None`: the key is not
    /// cached, or its op measured nothing): the costs table `run` prints
    /// needs no more of the row. An index of version 5 or older opened
    /// read-only has no costs.
    pub fn lookup_costs(&self, key: &str) -> Result<Option<crate::costs::NodeCosts>, StoreError> {
        if self.columns != Self::COLUMNS {
            return Ok(None);
        }
        let raw: Option<Option<String>> = self
            .conn
            .prepare_cached("SELECT costs FROM nodes WHERE key = ?1")
            .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
            .map_err(db("looking up a key's costs"))?;
        raw.flatten().map(|text| parse(&text, "costs")).transpose()
    }

    /// The most recent completed record of a node id in a run of this spec
    /// and profile, for "why" and `explain`: a node of the same name in
    /// another spec or profile is another node (its params would be diffed
    /// against the wrong ones). Records that came from a remote belong to no
    /// run here and are not considered.
    pub fn latest_for_node(&self, node_id: &str, spec: SpecRef<'_>) -> Result<Option<CachedNode>, StoreError> {
        let raw = self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM nodes WHERE node_id = ?1 AND run_id IN \
                 (SELECT run_id FROM runs WHERE spec = ?2 AND profile IS ?3) \
                 ORDER BY finished_at DESC, rowid DESC LIMIT 1",
                self.columns
            ))
            .and_then(|mut s| s.query_row(params![node_id, spec.name, spec.profile], Self::row_to_cached).optional())
            .map_err(db("looking up a node's last record"))?;
        raw.map(Self::cached).transpose()
    }

    /// The most recent run in which this node id failed with exactly this key:
    /// (run id, error). For `plan`'s "failed in run R".
    pub fn last_failure(&self, node_id: &str, key: &str) -> Result<Option<(String, String)>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT n.run_id, COALESCE(n.detail, '') FROM run_nodes n JOIN runs r ON r.run_id = n.run_id
                 WHERE n.node_id = ?1 AND n.key = ?2 AND n.outcome = ?3
                 ORDER BY r.started_at DESC, r.rowid DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![node_id, key, NodeOutcome::Failed], |r| Ok((r.get(0)?, r.get(1)?))).optional()
            })
            .map_err(db("looking up a node's last failure"))
    }

    /// Commits a completed node: the last step of publishing.
    pub fn insert_node(&self, n: &CachedNode) -> Result<(), StoreError> {
        self.end_reads()?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO nodes (key, node_id, spec, record, outputs, seconds, finished_at, run_id, costs)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    n.key,
                    n.node_id,
                    n.spec,
                    json(&n.record),
                    json(&n.outputs),
                    n.seconds,
                    n.finished_at,
                    n.run_id,
                    n.costs.as_ref().map(json)
                ])
            })
            .map_err(db("committing a node"))?;
        Ok(())
    }

    /// Whether any cache row has an output `gc --drop-states` dropped (a
    /// run then checks whether it needs one).
    pub fn any_dropped(&self) -> Result<bool, StoreError> {
        self.conn.query_row(ANY_DROPPED, [], |r| r.get(0)).map_err(db("looking for dropped outputs"))
    }

    /// Removes cache rows (for `gc`), in one transaction: all or none.
    pub fn delete_nodes(&mut self, keys: &[Key]) -> Result<(), StoreError> {
        self.end_reads()?;
        let tx = self.conn.transaction().map_err(db("starting to remove cache rows"))?;
        {
            let mut stmt = tx.prepare("DELETE FROM nodes WHERE key = ?1").map_err(db("removing cache rows"))?;
            for k in keys {
                stmt.execute(params![k]).map_err(db("removing a cache row"))?;
            }
        }
        tx.commit().map_err(db("removing cache rows"))
    }

    /// Refreshes the stats of a node's outputs after a re-hash proved them unchanged.
    pub fn update_outputs(&self, key: &str, outputs: &[OutputRecord]) -> Result<(), StoreError> {
        self.end_reads()?;
        self.conn
            .prepare_cached("UPDATE nodes SET outputs = ?2 WHERE key = ?1")
            .and_then(|mut s| s.execute(params![key, json(&outputs)]))
            .map_err(db("updating output stats"))?;
        Ok(())
    }

    /// Records a run as started (folding in first the runs of hits alone
    /// that wait beside the index: a run that writes here anyway keeps that
    /// file short).
    pub fn start_run(&self, run: &RunRow, argv: &str) -> Result<(), StoreError> {
        self.fold_history()?;
        insert_run(&self.conn, run, argv)
    }

    /// Moves the runs of hits alone kept beside the index ([`super::history`])
    /// into it, in one transaction.
    pub fn fold_history(&self) -> Result<(), StoreError> {
        self.end_reads()?;
        history::fold(&self.history, |runs| {
            let tx = self.conn.unchecked_transaction().map_err(db("starting to fold runs in"))?;
            for p in runs {
                let r = &p.run;
                tx.execute(
                    "INSERT OR REPLACE INTO runs (run_id, spec, profile, argv, pid, started_at, finished_at, status, summary)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    params![r.run_id, r.spec, r.profile, p.argv, p.pid, r.started_at, r.finished_at, r.status, r.summary],
                )
                .map_err(db("folding a run in"))?;
                insert_outcomes(&tx, &r.run_id, &p.nodes, &p.events)?;
            }
            tx.commit().map_err(db("folding runs in"))
        })
    }

    /// Records the end of a run together with its node outcomes and events,
    /// in one transaction; `unstarted`: the run's row and command line, when
    /// it was never recorded as started (a run of cache hits alone), recorded
    /// in the same transaction.
    pub fn finish_run(
        &mut self,
        run_id: &str,
        status: &str,
        summary: &str,
        nodes: &[RunNodeRow],
        events: &[(u64, String)],
        unstarted: Option<(&RunRow, &str)>,
    ) -> Result<(), StoreError> {
        self.end_reads()?;
        let finished_at = super::now_rfc3339();
        if let Some((run, argv)) = unstarted {
            // A run of hits alone that ended well changed no cache row: its
            // history waits beside the index ([`super::history`]).
            if self.defer_history && status == "ok" && nodes.iter().all(|n| n.outcome == NodeOutcome::Cached) {
                let pending = PendingRun {
                    run: RunRow {
                        finished_at: Some(finished_at),
                        status: status.to_string(),
                        summary: Some(summary.to_string()),
                        ..run.clone()
                    },
                    argv: argv.to_string(),
                    pid: std::process::id(),
                    nodes: nodes.to_vec(),
                    events: events.to_vec(),
                };
                if history::append(&self.history, &pending)? > history::FOLD_AT {
                    self.fold_history()?;
                }
                return Ok(());
            }
        }
        let tx = self.conn.transaction().map_err(db("starting a transaction"))?;
        if let Some((run, argv)) = unstarted {
            insert_run(&tx, run, argv)?;
        }
        {
            insert_outcomes(&tx, run_id, nodes, events)?;
            tx.execute(
                "UPDATE runs SET finished_at = ?2, status = ?3, summary = ?4 WHERE run_id = ?1",
                params![run_id, finished_at, status, summary],
            )
            .map_err(db("finishing a run"))?;
        }
        tx.commit().map_err(db("committing a run"))
    }

    /// The latest runs, newest first: those of hits alone still kept beside
    /// the index ([`super::history`]) with those here (that file is read
    /// first, so a run folded in meanwhile is here).
    pub fn recent_runs(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let pending = history::read(&self.history)?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT run_id, spec, profile, started_at, finished_at, status, summary FROM runs
                 ORDER BY started_at DESC, rowid DESC LIMIT ?1",
            )
            .map_err(db("listing runs"))?;
        let rows = stmt
            .query_map(params![limit as i64], |r| {
                Ok(RunRow {
                    run_id: r.get(0)?,
                    spec: r.get(1)?,
                    profile: r.get(2)?,
                    started_at: r.get(3)?,
                    finished_at: r.get(4)?,
                    status: r.get(5)?,
                    summary: r.get(6)?,
                })
            })
            .map_err(db("listing runs"))?;
        let mut runs: Vec<RunRow> = rows.collect::<Result<_, _>>().map_err(db("listing runs"))?;
        if pending.is_empty() {
            return Ok(runs);
        }
        let here: std::collections::HashSet<String> = runs.iter().map(|r| r.run_id.clone()).collect();
        let mut all: Vec<RunRow> =
            pending.into_iter().rev().map(|p| p.run).filter(|r| !here.contains(&r.run_id)).collect();
        all.append(&mut runs);
        // Stable: of two runs started at the same instant, the later recorded first.
        all.sort_by(|a, b| b.started_at.cmp(&a.started_at));
        all.truncate(limit);
        Ok(all)
    }

    /// A run still kept beside the index ([`super::history`]), if it is one.
    fn pending_run(&self, run_id: &str) -> Result<Option<PendingRun>, StoreError> {
        Ok(history::read(&self.history)?.into_iter().rev().find(|p| p.run.run_id == run_id))
    }

    pub fn run_nodes(&self, run_id: &str) -> Result<Vec<RunNodeRow>, StoreError> {
        if let Some(mut p) = self.pending_run(run_id)? {
            p.nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
            return Ok(p.nodes);
        }
        let outputs = if self.run_outputs { "outputs" } else { "NULL" };
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT node_id, key, outcome, seconds, detail, {outputs} FROM run_nodes WHERE run_id = ?1 ORDER BY node_id"
            ))
            .map_err(db("listing run nodes"))?;
        let rows = stmt
            .query_map(params![run_id], |r| {
                Ok((
                    RunNodeRow {
                        node_id: r.get(0)?,
                        key: r.get(1)?,
                        outcome: r.get(2)?,
                        seconds: r.get(3)?,
                        detail: r.get(4)?,
                        outputs: None,
                    },
                    r.get::<_, Option<String>>(5)?,
                ))
            })
            .map_err(db("listing run nodes"))?;
        let rows: Vec<_> = rows.collect::<Result<_, _>>().map_err(db("listing run nodes"))?;
        rows.into_iter()
            .map(|(mut row, outputs)| {
                let what = || format!("outputs of node '{}' in run {run_id}", row.node_id);
                row.outputs = outputs.map(|text| parse(&text, &what())).transpose()?;
                Ok(row)
            })
            .collect()
    }

    /// Appends an event to a finished run's log (after its last one).
    pub fn append_event(&self, run_id: &str, event: &str) -> Result<(), StoreError> {
        self.fold_history()?;
        self.conn
            .execute(
                "INSERT INTO events (run_id, seq, event)
                 SELECT ?1, COALESCE(MAX(seq) + 1, 0), ?2 FROM events WHERE run_id = ?1",
                params![run_id, event],
            )
            .map_err(db("appending an event"))?;
        Ok(())
    }

    /// The events of a run, in order.
    pub fn run_events(&self, run_id: &str) -> Result<Vec<String>, StoreError> {
        if let Some(mut p) = self.pending_run(run_id)? {
            p.events.sort_by_key(|(seq, _)| *seq);
            return Ok(p.events.into_iter().map(|(_, e)| e).collect());
        }
        let mut stmt = self
            .conn
            .prepare("SELECT event FROM events WHERE run_id = ?1 ORDER BY seq")
            .map_err(db("reading events"))?;
        let rows = stmt.query_map(params![run_id], |r| r.get(0)).map_err(db("reading events"))?;
        rows.collect::<Result<_, _>>().map_err(db("reading events"))
    }

    /// Every completed node, for `store verify`.
    pub fn all_nodes(&self) -> Result<Vec<CachedNode>, StoreError> {
        let mut stmt =
            self.conn.prepare(&format!("SELECT {} FROM nodes", self.columns)).map_err(db("listing nodes"))?;
        let raw: Vec<_> = stmt
            .query_map([], Self::row_to_cached)
            .map_err(db("listing nodes"))?
            .collect::<Result<_, _>>()
            .map_err(db("listing nodes"))?;
        raw.into_iter().map(Self::cached).collect()
    }

    pub fn file_hash(&self, path: &str, stat: &FileStat) -> Result<Option<String>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT hash FROM file_stats WHERE path = ?1 AND size = ?2 AND mtime_ns = ?3 AND ctime_ns = ?4 AND ino = ?5",
            )
            .and_then(|mut s| {
                let Some(ctime) = stat.ctime_ns else { return Ok(None) };
                s.query_row(params![path, stat.size as i64, stat.mtime_ns, ctime, stat.ino as i64], |r| r.get(0))
                    .optional()
            })
            .map_err(db("reading the stat cache"))
    }

    pub fn put_file_hash(&self, path: &str, stat: &FileStat, hash: &str) -> Result<(), StoreError> {
        self.end_reads()?;
        let Some(ctime) = stat.ctime_ns else { return Ok(()) };
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO file_stats (path, size, mtime_ns, ctime_ns, ino, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| s.execute(params![path, stat.size as i64, stat.mtime_ns, ctime, stat.ino as i64, hash]))
            .map_err(db("writing the stat cache"))?;
        Ok(())
    }
}

#[cfg(test)]
mod migration_tests {
    use super::*;

    /// An index of version 5 (no `costs` column): opened, it gains the column
    /// and keeps its rows; opened read-only (by `plan`), it reads them without costs.
    #[test]
    fn an_index_of_version_5_gains_the_costs_column_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let key = "ab".repeat(32);
        // A record as version 5 wrote it.
        const RECORD: &str = r#"{"files":{},"inputs":{},"op":"shell","op_version":1,"params":{"cmd":"true"}}"#;
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&format!(
                "CREATE TABLE nodes (key TEXT PRIMARY KEY, node_id TEXT NOT NULL, spec TEXT NOT NULL, record TEXT NOT NULL,
                   outputs TEXT NOT NULL, seconds REAL NOT NULL, finished_at TEXT NOT NULL, run_id TEXT NOT NULL);
                 INSERT INTO nodes VALUES ('{key}', 'a', 's', '{RECORD}', '[]', 1.5, 'then', 'r1');
                 PRAGMA user_version = 5;"
            ))
            .unwrap();
        }
        let read_only = Index::open_read_only(&path).unwrap();
        let old = read_only.lookup(&key).unwrap().unwrap();
        assert_eq!((old.node_id.as_str(), old.costs), ("a", None));
        assert_eq!(read_only.lookup_costs(&key).unwrap(), None, "no costs column, no costs");
        drop(read_only);
        let index = Index::open(&path).unwrap();
        assert_eq!(index.lookup(&key).unwrap().unwrap().seconds, 1.5, "the row is kept");
        assert_eq!(index.lookup_costs(&key).unwrap(), None, "a row without costs");
        let costs = crate::costs::NodeCosts {
            process: crate::costs::RunCosts { seconds: 2.0, optimization_seconds: None, peak_rss_bytes: Some(7) },
            iterations: Default::default(),
        };
        let node = CachedNode { costs: Some(costs.clone()), ..old };
        index.insert_node(&node).unwrap();
        assert_eq!(index.lookup(&key).unwrap().unwrap().costs, Some(costs.clone()));
        assert_eq!(index.lookup_costs(&key).unwrap(), Some(costs), "the costs column alone reads the same");
        assert_eq!(index.lookup_costs(&"ef".repeat(32)).unwrap(), None, "a key not cached");
        drop(index);
        // Opening it again adds nothing twice.
        assert!(Index::open(&path).unwrap().lookup(&key).unwrap().unwrap().costs.is_some());
    }

    /// An index whose run_nodes predate the `outputs` column: read-only (by
    /// `report`), its runs read as having recorded no outputs; opened, it
    /// gains the column, keeps its rows, and records the outputs of new runs.
    #[test]
    fn an_index_from_before_runs_kept_their_outputs_gains_the_column_and_keeps_its_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        drop(Index::open(&path).unwrap());
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "DROP TABLE run_nodes;
                 CREATE TABLE run_nodes (run_id TEXT NOT NULL, node_id TEXT NOT NULL, key TEXT, outcome TEXT NOT NULL,
                   seconds REAL, detail TEXT, PRIMARY KEY (run_id, node_id));
                 INSERT INTO run_nodes VALUES ('r1', 'a', NULL, 'ran', 1.5, NULL);",
            )
            .unwrap();
        }
        let read_only = Index::open_read_only(&path).unwrap();
        let rows = read_only.run_nodes("r1").unwrap();
        assert_eq!((rows.len(), rows[0].seconds, rows[0].outputs.is_none()), (1, Some(1.5), true));
        drop(read_only);
        let mut index = Index::open(&path).unwrap();
        assert!(index.run_nodes("r1").unwrap()[0].outputs.is_none(), "the old row is kept, with no outputs");
        let had = RunOutput {
            name: "m.json".into(),
            object: ObjectInfo { hash: "ef".repeat(32), kind: crate::store::OutputKind::File, size: 3, files: 1 },
        };
        let row = RunNodeRow {
            node_id: "b".into(),
            key: None,
            outcome: NodeOutcome::Ran,
            seconds: None,
            detail: None,
            outputs: Some(vec![had.clone()]),
        };
        index.finish_run("r2", "ok", "", &[row], &[], None).unwrap();
        assert_eq!(index.run_nodes("r2").unwrap()[0].outputs, Some(vec![had]));
        drop(index);
        assert!(Index::open(&path).is_ok(), "opening it again adds nothing twice");
    }

    /// The record is typed where the row is read: one that does not read as
    /// a hash-input record is an error naming it, never a row with a guessed record.
    #[test]
    fn a_row_whose_record_does_not_read_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let index = Index::open(&path).unwrap();
        let key = "cd".repeat(32);
        index
            .conn
            .execute(
                "INSERT INTO nodes (key, node_id, spec, record, outputs, seconds, finished_at, run_id) \
                 VALUES (?1, 'a', 's', '{\"params\": 1}', '[]', 1.0, 'then', 'r1')",
                [&key],
            )
            .unwrap();
        let e = index.lookup(&key).unwrap_err().to_string();
        assert!(e.contains("corrupt hash-input record in the index") && e.contains("missing field `op`"), "{e}");
    }

    #[test]
    fn an_index_of_version_4_keeps_its_rows_and_its_stat_cache_starts_over_with_ctime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE runs (run_id TEXT PRIMARY KEY, spec TEXT NOT NULL, profile TEXT, argv TEXT NOT NULL,
                   pid INTEGER NOT NULL, started_at TEXT NOT NULL, finished_at TEXT, status TEXT NOT NULL, summary TEXT);
                 INSERT INTO runs VALUES ('r1', 's', NULL, 'run', 1, '2026-01-01T00:00:00Z', NULL, 'ok', NULL);
                 CREATE TABLE file_stats (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
                   ino INTEGER NOT NULL, hash TEXT NOT NULL);
                 INSERT INTO file_stats VALUES ('/x', 1, 2, 3, 'h');
                 PRAGMA user_version = 4;",
            )
            .unwrap();
        }
        let index = Index::open(&path).unwrap();
        assert_eq!(index.recent_runs(10).unwrap().len(), 1, "runs are kept");
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let stat = FileStat::of(&file).unwrap();
        assert!(stat.ctime_ns.is_some());
        assert_eq!(index.file_hash("/x", &stat).unwrap(), None);
        index.put_file_hash("/f", &stat, "hf").unwrap();
        assert_eq!(index.file_hash("/f", &stat).unwrap().as_deref(), Some("hf"));
        let changed = FileStat { ctime_ns: stat.ctime_ns.map(|c| c + 1), ..stat };
        assert_eq!(index.file_hash("/f", &changed).unwrap(), None, "a different ctime is a miss");
        // A record from before ctime was kept never matches.
        let old: FileStat = serde_json::from_str(r#"{"size": 1, "mtime_ns": 2, "ino": 3}"#).unwrap();
        assert_eq!(old.ctime_ns, None);
        assert_ne!(Some(old), Some(FileStat { ctime_ns: Some(0), ..old }));
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    fn node(key: &str) -> CachedNode {
        CachedNode {
            key: Key::parse(key).unwrap(),
            node_id: "a".into(),
            spec: "s".into(),
            record: crate::record::HashInputs::empty_shell(),
            outputs: Vec::new(),
            seconds: 1.0,
            finished_at: "now".into(),
            run_id: "r".into(),
            costs: None,
        }
    }

    /// `any_dropped` reads only the rows with a dropped output (a partial
    /// index holds them), not every row of the cache, which `run` would
    /// otherwise scan on each start however large the cache grew; an index
    /// made before that index existed gains it when opened, and answers the same.
    #[test]
    fn any_dropped_reads_a_partial_index_not_every_cache_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let plan = |index: &Index| -> String {
            let mut stmt = index.conn.prepare(&format!("EXPLAIN QUERY PLAN {ANY_DROPPED}")).unwrap();
            let rows = stmt.query_map([], |r| r.get::<_, String>(3)).unwrap();
            rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
        };
        let index = Index::open(&path).unwrap();
        assert!(plan(&index).contains("USING INDEX nodes_dropped"), "{}", plan(&index));
        index.insert_node(&node(&"ab".repeat(32))).unwrap();
        assert!(!index.any_dropped().unwrap());
        let mut dropped = node(&"cd".repeat(32));
        dropped.outputs = vec![OutputRecord {
            name: "state".into(),
            object: crate::store::objects::ObjectInfo {
                hash: "ef".repeat(32),
                size: 1,
                kind: crate::store::OutputKind::File,
                files: 1,
            },
            workspace_path: None,
            stat: None,
            dropped: Some("gc --drop-states".into()),
        }];
        index.insert_node(&dropped).unwrap();
        assert!(index.any_dropped().unwrap());
        // As an index of version 6 was: no partial index.
        index.conn.execute_batch("DROP INDEX nodes_dropped").unwrap();
        assert!(!plan(&index).contains("nodes_dropped"));
        drop(index);
        let index = Index::open(&path).unwrap();
        assert!(plan(&index).contains("USING INDEX nodes_dropped"), "{}", plan(&index));
        assert!(index.any_dropped().unwrap());
    }

    /// Reads in a batch share one transaction: what another connection
    /// commits meanwhile is seen once the batch ends, not before (the
    /// scheduler ends its batch before it waits, so no snapshot outlives a
    /// burst of cache hits).
    #[test]
    fn reads_in_a_batch_share_one_snapshot_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let reader = Index::open(&path).unwrap();
        let writer = Index::open(&path).unwrap();
        let (a, b) = ("ab".repeat(32), "cd".repeat(32));
        writer.insert_node(&node(&a)).unwrap();
        reader.batch_reads().unwrap();
        assert!(reader.lookup_outputs(&a).unwrap().is_some());
        writer.insert_node(&node(&b)).unwrap();
        assert!(reader.lookup_outputs(&b).unwrap().is_none(), "the batch reads the snapshot it started with");
        reader.end_reads().unwrap();
        assert!(reader.lookup_outputs(&b).unwrap().is_some(), "after the batch, the commit is seen");
        // Outside a batch each read is its own transaction, as before.
        let c = "ef".repeat(32);
        writer.insert_node(&node(&c)).unwrap();
        assert!(reader.lookup_outputs(&c).unwrap().is_some());
    }

    /// A write during a batch ends the batch first: it never upgrades the
    /// batch's read snapshot, which fails (SQLITE_BUSY_SNAPSHOT, not retried
    /// by the busy timeout) once another connection has committed since.
    #[test]
    fn a_write_during_a_batch_succeeds_after_another_connection_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let mut reader = Index::open(&path).unwrap();
        let writer = Index::open(&path).unwrap();
        let (a, c) = ("ab".repeat(32), "ef".repeat(32));
        writer.insert_node(&node(&a)).unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let stat = FileStat::of(&file).unwrap();
        type Write<'a> = &'a dyn Fn(&mut Index) -> Result<(), StoreError>;
        let writes: [(&str, Write); 5] = [
            ("put_file_hash", &|i| i.put_file_hash("/f", &stat, "h")),
            ("update_outputs", &|i| i.update_outputs(&a, &[])),
            ("insert_node", &|i| i.insert_node(&node(&c))),
            ("delete_nodes", &|i| i.delete_nodes(&[Key::parse(&c).unwrap()])),
            ("finish_run", &|i| {
                let run = RunRow {
                    run_id: "r1".into(),
                    spec: "s".into(),
                    profile: None,
                    started_at: "then".into(),
                    finished_at: None,
                    status: "running".into(),
                    summary: None,
                };
                i.finish_run("r1", "ok", "", &[], &[], Some((&run, "run")))
            }),
        ];
        for (n, (what, write)) in writes.iter().enumerate() {
            reader.batch_reads().unwrap();
            assert!(reader.lookup_outputs(&a).unwrap().is_some());
            // Another connection commits: the batch's snapshot is now stale.
            let other = format!("{:02x}", n + 1).repeat(32);
            writer.insert_node(&node(&other)).unwrap();
            write(&mut reader).unwrap_or_else(|e| panic!("{what} during a batch: {e}"));
            assert!(reader.lookup_outputs(&other).unwrap().is_some(), "{what}: the batch ended");
        }
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;
    use std::io::Write;

    fn run(id: &str, started_at: &str) -> RunRow {
        RunRow {
            run_id: id.into(),
            spec: "s".into(),
            profile: None,
            started_at: started_at.into(),
            finished_at: None,
            status: "running".into(),
            summary: None,
        }
    }

    fn outcome(node: &str, outcome: NodeOutcome) -> RunNodeRow {
        RunNodeRow { node_id: node.into(), key: None, outcome, seconds: None, detail: None, outputs: None }
    }

    fn runs_here(index: &Index) -> Vec<String> {
        let mut stmt = index.conn.prepare("SELECT run_id FROM runs ORDER BY run_id").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    fn ids(runs: &[RunRow]) -> Vec<&str> {
        runs.iter().map(|r| r.run_id.as_str()).collect()
    }

    /// A run of hits alone is kept beside the index, not committed to it
    /// (no WAL made, no checkpoint), and every read of the history sees it
    /// at once, a read-only connection's too; the next run that writes the
    /// index folds it in, and the reads answer the same.
    #[test]
    fn a_run_of_hits_alone_waits_beside_the_index_and_reads_as_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let mut index = Index::open(&path).unwrap();
        assert!(index.defer_history, "a local filesystem: WAL mode");
        let first = run("r1", "2026-12-05T10:00:00Z");
        index.start_run(&first, "run").unwrap();
        index.finish_run("r1", "ok", "1 ran", &[outcome("a", NodeOutcome::Ran)], &[(0, "{}".into())], None).unwrap();
        let hits = [outcome("b", NodeOutcome::Cached), outcome("a", NodeOutcome::Cached)];
        let events = [(1, "{\"e\":1}".to_string()), (0, "{\"e\":0}".to_string())];
        let second = run("r2", "2026-12-05T11:00:00Z");
        index.finish_run("r2", "ok", "0 ran, 2 cached", &hits, &events, Some((&second, "run again"))).unwrap();
        assert_eq!(runs_here(&index), ["r1"], "the run of hits is not in the index");
        let beside = dir.path().join("index.sqlite-runs");
        assert!(std::fs::metadata(&beside).unwrap().len() > 0);

        let reads = |index: &Index| {
            let runs = index.recent_runs(10).unwrap();
            assert_eq!(ids(&runs), ["r2", "r1"], "newest first");
            assert_eq!(runs[0].status, "ok");
            assert_eq!(runs[0].summary.as_deref(), Some("0 ran, 2 cached"));
            assert!(runs[0].finished_at.is_some());
            assert_eq!(ids(&index.recent_runs(1).unwrap()), ["r2"]);
            let nodes: Vec<_> = index.run_nodes("r2").unwrap().into_iter().map(|n| (n.node_id, n.outcome)).collect();
            assert_eq!(nodes, [("a".into(), NodeOutcome::Cached), ("b".into(), NodeOutcome::Cached)]);
            assert_eq!(index.run_events("r2").unwrap(), ["{\"e\":0}", "{\"e\":1}"], "in seq order");
            assert_eq!(index.run_events("r1").unwrap(), ["{}"]);
        };
        reads(&index);
        reads(&Index::open_read_only(&path).unwrap());

        // A run with work folds it in first: the same answers, from the index.
        index.start_run(&run("r3", "2026-12-05T12:00:00Z"), "run").unwrap();
        assert_eq!(std::fs::metadata(&beside).unwrap().len(), 0, "emptied once folded in");
        assert_eq!(runs_here(&index), ["r1", "r2", "r3"]);
        let runs = index.recent_runs(10).unwrap();
        assert_eq!(ids(&runs), ["r3", "r2", "r1"]);
        assert_eq!(runs[1].summary.as_deref(), Some("0 ran, 2 cached"));
        assert_eq!(index.run_events("r2").unwrap(), ["{\"e\":0}", "{\"e\":1}"]);
        assert_eq!(index.run_nodes("r2").unwrap().len(), 2);
        // Folding again (a fold killed after its commit leaves its lines) changes nothing.
        index.fold_history().unwrap();
        assert_eq!(runs_here(&index), ["r1", "r2", "r3"]);
    }

    /// Only a run of hits alone that ended well waits: a failure (which
    /// `plan` looks up in the index), an interrupted run, or a run that ran a
    /// node is committed at once.
    #[test]
    fn a_run_with_a_failure_or_an_interruption_is_committed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let mut index = Index::open(&path).unwrap();
        let cases = [
            ("r1", "failed", NodeOutcome::Failed),
            ("r2", "interrupted", NodeOutcome::Cached),
            ("r3", "ok", NodeOutcome::Ran),
            ("r4", "failed", NodeOutcome::Skipped),
        ];
        for (id, status, o) in cases {
            let row = run(id, "2026-12-05T10:00:00Z");
            index.finish_run(id, status, "", &[outcome("a", o)], &[], Some((&row, "run"))).unwrap();
        }
        assert_eq!(runs_here(&index), ["r1", "r2", "r3", "r4"]);
        assert!(history::read(&dir.path().join("index.sqlite-runs")).unwrap().is_empty());
    }

    /// Processes recording runs of hits while another folds the file in
    /// lose none and record none twice: appends take the lock shared, a fold
    /// exclusive, from its read to its truncation.
    #[test]
    fn runs_recorded_while_another_connection_folds_are_all_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        drop(Index::open(&path).unwrap());
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let folder = {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let index = Index::open(&path).unwrap();
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    index.fold_history().unwrap();
                }
            })
        };
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut index = Index::open(&path).unwrap();
                    for i in 0..25 {
                        let row = run(&format!("w{w}-{i:02}"), &format!("2026-12-05T10:{w:02}:{i:02}Z"));
                        let hits = [outcome("a", NodeOutcome::Cached)];
                        index
                            .finish_run(&row.run_id, "ok", "", &hits, &[(0, "{}".into())], Some((&row, "run")))
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        folder.join().unwrap();
        let index = Index::open(&path).unwrap();
        let mut listed: Vec<String> = index.recent_runs(1000).unwrap().into_iter().map(|r| r.run_id).collect();
        assert_eq!(listed.len(), 100, "every run once: {listed:?}");
        listed.sort();
        listed.dedup();
        assert_eq!(listed.len(), 100);
        index.fold_history().unwrap();
        assert_eq!(runs_here(&index).len(), 100);
        assert_eq!(index.run_events("w3-24").unwrap(), ["{}"]);
    }

    /// The file folds itself in once it grows past its bound, so a workspace
    /// re-run in a loop does not grow it without end; a line a power loss
    /// tore is left out, and a link where the file should be is refused.
    #[test]
    fn the_file_is_bounded_a_torn_line_is_left_out_and_a_link_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.sqlite");
        let mut index = Index::open(&path).unwrap();
        let beside = dir.path().join("index.sqlite-runs");
        let hits: Vec<RunNodeRow> = (0..200).map(|i| outcome(&format!("node-{i:03}"), NodeOutcome::Cached)).collect();
        let mut n = 0;
        while runs_here(&index).is_empty() {
            n += 1;
            assert!(n < 1000, "never folded in");
            let row = run(&format!("r{n:04}"), &format!("2026-12-05T10:{:02}:{:02}Z", n / 60, n % 60));
            index.finish_run(&row.run_id, "ok", "", &hits, &[], Some((&row, "run"))).unwrap();
        }
        assert!(n > 1, "folded at the first run");
        assert_eq!(runs_here(&index).len(), n, "every run folded in at once");
        assert_eq!(std::fs::metadata(&beside).unwrap().len(), 0);

        let row = run("torn", "2026-12-05T11:00:00Z");
        index.finish_run("torn", "ok", "", &hits, &[], Some((&row, "run"))).unwrap();
        std::fs::OpenOptions::new().append(true).open(&beside).unwrap().write_all(b"{\"run\":{\"run_id\":").unwrap();
        assert_eq!(index.recent_runs(1).unwrap()[0].run_id, "torn", "the whole line reads, the torn one not");
        index.fold_history().unwrap();
        assert_eq!(runs_here(&index).len(), n + 1);

        std::fs::remove_file(&beside).unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::write(&theirs, "").unwrap();
        std::os::unix::fs::symlink(&theirs, &beside).unwrap();
        let row = run("linked", "2026-12-05T12:00:00Z");
        let err = index.finish_run("linked", "ok", "", &hits, &[], Some((&row, "run"))).unwrap_err().to_string();
        assert!(err.contains("index.sqlite-runs"), "{err}");
        assert_eq!(std::fs::read(&theirs).unwrap(), b"", "nothing written through the link");
        assert!(index.recent_runs(1).is_err(), "nor read through it");
    }
}
