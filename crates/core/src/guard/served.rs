//! The executor's end of a served ledger ([`Ledger::served`] is the
//! worker's): it reads the worker's [`Request`]s a line at a time, runs each on
//! its own connection to the workspace's `guard.sqlite` in the transaction
//! the database backend uses, and answers with a [`Reply`]. The worker is
//! held to what its node may do: it claims rollouts only for its own key, and
//! appends only typed events in canonical form, each kind by its producer.

use std::io::{BufRead, Write};
use std::path::Path;

use super::events::GuardEvent;
use super::ledger::{read_line, Ledger, Reply, Request};
use crate::ids::short;
use crate::store::StoreError;

/// What a served worker asked, counted when its channel closed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    pub requests: usize,
    pub refused: usize,
}

/// Serves the ledger at `path` to the worker of the node keyed `owner`
/// until the worker closes its end (or exits). The database is opened at the
/// first request, so a worker that asks nothing costs no connection. A
/// request that does not read, or that its node may not make, is refused
/// with a message and changes nothing; the worker decides what a refusal
/// means (the GRPO loop fails). Only a broken channel ends serving early.
pub fn serve(path: &Path, owner: &str, reader: &mut impl BufRead, writer: &mut impl Write) -> std::io::Result<Served> {
    let mut ledger: Option<Ledger> = None;
    let mut served = Served::default();
    while let Some(line) = read_line(reader)? {
        served.requests += 1;
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply::Refused { message: format!("a ledger request that does not read: {e}") },
            Ok(request) => {
                let answer = match &mut ledger {
                    Some(l) => answer(l, owner, request),
                    None => match Ledger::open_at(path) {
                        Ok(l) => answer(ledger.insert(l), owner, request),
                        Err(e) => Err(e),
                    },
                };
                answer.unwrap_or_else(|e| Reply::Refused { message: e.to_string() })
            }
        };
        if matches!(reply, Reply::Refused { .. }) {
            served.refused += 1;
        }
        let mut bytes = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        writer.write_all(&bytes)?;
        writer.flush()?;
    }
    Ok(served)
}

fn answer(ledger: &mut Ledger, owner: &str, request: Request) -> Result<Reply, StoreError> {
    Ok(match request {
        Request::ClaimRollouts { lineage, owner: claimant, ids } => {
            if claimant != owner {
                return Err(StoreError::Invalid(format!(
                    "a node claims rollouts for its own key only ({}), not for {}",
                    short(owner),
                    short(&claimant)
                )));
            }
            ledger.claim_rollouts(&lineage, owner, &ids)?;
            Reply::Done
        }
        Request::AppendEvent { lineage, producer, kind, payload } => {
            let event = GuardEvent::parse(&producer, &kind, &payload)
                .map_err(|e| StoreError::Invalid(format!("refusing to append a '{kind}' event: {e}")))?;
            if event.canonical_payload() != payload {
                return Err(StoreError::Invalid(format!(
                    "refusing to append a '{kind}' event whose payload is not in canonical form"
                )));
            }
            Reply::Sealed { seal: ledger.append_event(&lineage, &producer, &kind, &payload)? }
        }
        Request::RestartChain { lineage, keep } => Reply::SetAside { aside: ledger.restart_chain(&lineage, keep)? },
        Request::Events { lineage } => Reply::Events { events: ledger.events(&lineage)? },
        Request::RegisterNonce { nonce, batch_hash, policy_digest } => {
            ledger.register_nonce(&nonce, &batch_hash, &policy_digest)?;
            Reply::Done
        }
        Request::ConsumeNonce { nonce } => Reply::Spent { spent: ledger.consume_nonce(&nonce)? },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::events::{ControlEvent, PolicySync};
    use std::io::BufReader;

    /// A worker's ledger served over a socket pair, the executor's end in a
    /// thread, as `run_in_worker` does.
    fn with_served<T>(dir: &Path, owner: &str, body: impl FnOnce(&mut Ledger) -> T) -> (T, Served) {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let path = dir.join("guard.sqlite");
        let owner = owner.to_string();
        let server = std::thread::spawn(move || {
            let mut reader = BufReader::new(ours.try_clone().unwrap());
            let mut writer = ours;
            serve(&path, &owner, &mut reader, &mut writer).unwrap()
        });
        let fd = std::os::fd::OwnedFd::from(theirs);
        let file = std::fs::File::from(fd);
        let mut ledger = Ledger::served(BufReader::new(file.try_clone().unwrap()), file);
        let out = body(&mut ledger);
        drop(ledger);
        (out, server.join().unwrap())
    }

    fn sync(iteration: usize) -> GuardEvent {
        GuardEvent::Control(ControlEvent::Sync(PolicySync { iteration, trainer_version: 0 }))
    }

    #[test]
    fn a_served_ledger_keeps_the_database_guarantees_and_writes_what_the_database_backend_writes() {
        let dir = tempfile::tempdir().unwrap();
        let ((), served) = with_served(dir.path(), "key-a", |l| {
            l.claim_rollouts("L", "key-a", &[0, 1, 2]).unwrap();
            l.claim_rollouts("L", "key-a", &[2]).unwrap();
            let seal = crate::guard::events::log(l, "L", &sync(0)).unwrap();
            crate::guard::events::log(l, "L", &sync(1)).unwrap();
            let events = l.events("L").unwrap();
            assert_eq!(events.len(), 2);
            assert_eq!(events[0].seal, seal);
            assert_eq!(crate::guard::events::verify_events(&events), None);
            l.register_nonce("n", "b", "p").unwrap();
            assert!(l.consume_nonce("n").unwrap(), "spent once");
            assert!(!l.consume_nonce("n").unwrap(), "never twice");
            assert_eq!(l.restart_chain("L", 1).unwrap(), Some("L~1".to_string()));
        });
        assert_eq!(served, Served { requests: 9, refused: 0 });
        // What the executor wrote is the database's: read back directly.
        let db = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
        assert_eq!(db.events("L").unwrap().len(), 1);
        assert_eq!(db.events("L~1").unwrap().len(), 2);
        let mut db = db;
        let e = db.claim_rollouts("L", "key-b", &[1]).unwrap_err().to_string();
        assert!(e.contains("already consumed"), "{e}");
    }

    #[test]
    fn a_worker_may_not_claim_for_another_key_nor_append_an_ill_typed_or_misowned_event() {
        let dir = tempfile::tempdir().unwrap();
        let ((), served) = with_served(dir.path(), "key-a", |l| {
            let e = l.claim_rollouts("L", "key-b", &[0]).unwrap_err().to_string();
            assert!(e.contains("its own key only"), "{e}");
            let e = l.append_event("L", "verifier", "sync", "{}").unwrap_err().to_string();
            assert!(e.contains("'sync'"), "{e}");
            let e = l.append_event("L", "control", "sync", "{\"iteration\": 0}").unwrap_err().to_string();
            assert!(e.contains("refusing"), "{e}");
            // A typed payload, but not canonical: its seal would not be reproducible.
            let event = sync(0);
            let spaced = serde_json::to_string_pretty(&crate::guard::events::Payload(&event)).unwrap();
            let e = l.append_event("L", "control", event.kind(), &spaced).unwrap_err().to_string();
            assert!(e.contains("canonical"), "{e}");
            assert!(l.events("L").unwrap().is_empty(), "nothing was appended");
        });
        assert_eq!(served, Served { requests: 5, refused: 4 });
        let mut db = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
        db.claim_rollouts("L", "key-b", &[0]).unwrap();
    }

    /// Names the worker sends are outside text: one whose 12th byte falls
    /// inside a character is shortened for a message, never sliced into a
    /// panic that would take the server down.
    #[test]
    fn a_refusal_shortens_a_non_ascii_name_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let ((), served) = with_served(dir.path(), "key-a", |l| {
            let e = l.claim_rollouts("L", "aéééééééééééé", &[0]).unwrap_err().to_string();
            assert!(e.contains("its own key only") && e.contains("éééééé"), "{e}");
            l.claim_rollouts("aéééééééé-lineage", "key-a", &[0]).unwrap();
        });
        assert_eq!(served, Served { requests: 2, refused: 1 });
        let mut db = Ledger::open_at(&dir.path().join("guard.sqlite")).unwrap();
        let e = db.claim_rollouts("aéééééééé-lineage", "aéééééééé-other-key", &[0]).unwrap_err().to_string();
        assert!(e.contains("already consumed"), "{e}");
    }

    #[test]
    fn a_request_that_does_not_read_is_refused_and_serving_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let input = b"{\"request\": \"drop_table\"}\n{\"request\": \"events\", \"lineage\": \"L\"}\n".to_vec();
        let mut out = Vec::new();
        let served = serve(&dir.path().join("guard.sqlite"), "k", &mut &input[..], &mut out).unwrap();
        assert_eq!(served, Served { requests: 2, refused: 1 });
        let replies: Vec<Reply> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(matches!(&replies[0], Reply::Refused { message } if message.contains("does not read")));
        assert_eq!(replies[1], Reply::Events { events: vec![] });
    }
}
