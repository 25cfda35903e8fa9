//! Signatures on cache records, and the policy that decides which records a
//! workspace accepts.

use serde::{Deserialize, Serialize};

use super::keys::{PublicKey, SecretKey};
use crate::store::{CachedNode, Key, OutputKind};

/// What a signature binds a key to: each output of the node.
#[derive(Serialize)]
struct SignedOutput<'a> {
    name: &'a str,
    kind: OutputKind,
    hash: &'a str,
    size: u64,
    files: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace_path: Option<&'a str>,
}

#[derive(Serialize)]
struct SignedRecord<'a> {
    /// The domain of the signature, so that it can never be taken for another.
    purpose: &'static str,
    key: &'a Key,
    outputs: Vec<SignedOutput<'a>>,
}

/// The bytes a record's signature covers: canonical JSON of its key and its
/// outputs (name, kind, hash, size, file count, path in the user's tree).
/// Nothing local (the node's name here, times, stats) and nothing the key
/// already covers (the hash inputs, which a reader recomputes the key from).
pub fn signed_payload(node: &CachedNode) -> Vec<u8> {
    let record = SignedRecord {
        purpose: "orchestrate.record-signature.v1",
        key: &node.key,
        outputs: node
            .outputs
            .iter()
            .map(|o| SignedOutput {
                name: &o.name,
                kind: o.object.kind,
                hash: &o.object.hash,
                size: o.object.size,
                files: o.object.files,
                workspace_path: o.workspace_path.as_deref(),
            })
            .collect(),
    };
    crate::canonical::to_canonical_json(&record).expect("a record serializes").into_bytes()
}

/// One signature on a record: the signer's key name and its ECDSA P-256
/// signature (DER, base64) over [`signed_payload`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSignature {
    pub key: String,
    pub sig: String,
}

/// Signs a record with `key`.
pub fn sign(node: &CachedNode, key: &SecretKey) -> RecordSignature {
    RecordSignature { key: key.name.clone(), sig: key.sign(&signed_payload(node)) }
}

/// How a record was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// Signed by these trusted keys.
    Signed(Vec<String>),
    /// No trusted key signed it, and the workspace does not require one (or
    /// `--trust-unsigned` said to take it): why it is unverified.
    Unverified(String),
}

/// Which records a workspace accepts: the keys it trusts and whether a
/// trusted signature is required (by default, once any key is trusted).
#[derive(Debug, Clone, Default)]
pub struct TrustPolicy {
    pub trusted: Vec<PublicKey>,
    pub require: bool,
    /// `--trust-unsigned`: a record without a trusted signature is accepted
    /// (and said to be unverified) even where one is required.
    pub accept_unverified: bool,
}

impl TrustPolicy {
    /// The policy of a workspace config: `trusted_keys` (each `NAME:BASE64`)
    /// and `require_signatures` (default: whether any key is trusted).
    pub fn from_config(trusted_keys: &[String], require: Option<bool>) -> Result<TrustPolicy, super::TrustError> {
        let mut trusted: Vec<PublicKey> = Vec::new();
        for line in trusted_keys {
            let k = PublicKey::parse(line)?;
            if trusted.iter().any(|t| t.name == k.name) {
                return Err(super::TrustError(format!("trusted key name '{}' is listed twice", k.name)));
            }
            trusted.push(k);
        }
        let require = require.unwrap_or(!trusted.is_empty());
        Ok(TrustPolicy { trusted, require, accept_unverified: false })
    }

    /// Why an accepted record deserves a flag: it was taken without a
    /// trusted signature where one is required (`--trust-unsigned`).
    pub fn flagged(&self, verified: &Verified) -> Option<String> {
        match verified {
            Verified::Unverified(why) if self.require => Some(why.clone()),
            _ => None,
        }
    }

    /// Whether `node`, carrying `signatures`, is accepted. A signature by a
    /// trusted key that does not verify is always refused: the record was
    /// altered after it was signed. `Err` says why a record is refused.
    pub fn check(&self, node: &CachedNode, signatures: &[RecordSignature]) -> Result<Verified, Refused> {
        let payload = signed_payload(node);
        let mut good = Vec::new();
        let mut unknown = Vec::new();
        for s in signatures {
            match self.trusted.iter().find(|k| k.name == s.key) {
                Some(k) if k.verifies(&payload, &s.sig) => good.push(s.key.clone()),
                Some(_) => return Err(Refused::BadSignature { key: crate::ids::escaped(&s.key).into_owned() }),
                None => unknown.push(crate::ids::escaped(&s.key).into_owned()),
            }
        }
        if !good.is_empty() {
            return Ok(Verified::Signed(good));
        }
        let why = if signatures.is_empty() {
            "unsigned".to_string()
        } else {
            format!("signed only by keys this workspace does not trust ({})", unknown.join(", "))
        };
        if self.require && !self.accept_unverified {
            return Err(Refused::Unverified { why });
        }
        Ok(Verified::Unverified(why))
    }
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Altered after it was signed: never taken, whatever the policy.
    #[error("bad signature by trusted key '{key}': the record is not what that key signed (altered after signing)")]
    BadSignature { key: String },
    /// Unsigned, or signed only by keys not trusted, where a trusted signature is required.
    #[error(
        "{why}; this workspace requires a signature by a trusted key (trusted_keys in its config.yaml; \
         --trust-unsigned takes it anyway)"
    )]
    Unverified { why: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ObjectInfo, OutputRecord};

    fn node(hash: &str) -> CachedNode {
        CachedNode {
            key: Key::parse(&"ab".repeat(32)).unwrap(),
            node_id: "a".into(),
            spec: "s".into(),
            record: crate::record::HashInputs::empty_shell(),
            outputs: vec![OutputRecord {
                name: "a.txt".into(),
                object: ObjectInfo { hash: hash.into(), kind: OutputKind::File, size: 6, files: 1 },
                workspace_path: Some("a.txt".into()),
                stat: None,
                dropped: None,
            }],
            seconds: 1.0,
            finished_at: "now".into(),
            run_id: "r".into(),
            costs: None,
        }
    }

    #[test]
    fn a_record_is_accepted_only_as_its_trusted_signer_signed_it() {
        let alice = SecretKey::generate("alice").unwrap();
        let bob = SecretKey::generate("bob").unwrap();
        let policy = TrustPolicy::from_config(&[alice.public().to_line()], None).unwrap();
        assert!(policy.require, "trusting a key requires signatures by default");
        let honest = node(&"1".repeat(64));
        let sig = sign(&honest, &alice);
        assert_eq!(policy.check(&honest, std::slice::from_ref(&sig)).unwrap(), Verified::Signed(vec!["alice".into()]));
        // The consistent lie: another valid object, the signature kept.
        let lie = node(&"2".repeat(64));
        assert!(policy
            .check(&lie, std::slice::from_ref(&sig))
            .unwrap_err()
            .to_string()
            .contains("bad signature by trusted key 'alice'"));
        // Local things are not signed: another node name, time or run reads the same.
        let mut renamed = honest.clone();
        (renamed.node_id, renamed.seconds, renamed.run_id) = ("b".into(), 9.0, "q".into());
        // Nor what the process cost (measured where it ran, never reproduced).
        renamed.costs = Some(crate::costs::NodeCosts {
            process: crate::costs::RunCosts { seconds: 9.0, optimization_seconds: None, peak_rss_bytes: Some(1) },
            iterations: Default::default(),
        });
        assert!(policy.check(&renamed, std::slice::from_ref(&sig)).is_ok());
        assert!(policy.check(&honest, &[]).unwrap_err().to_string().starts_with("unsigned;"));
        let e = policy.check(&honest, &[sign(&honest, &bob)]).unwrap_err().to_string();
        assert!(e.contains("does not trust (bob)"), "{e}");
        // A counter-signature by an untrusted key does not spoil a trusted one.
        assert!(policy.check(&honest, &[sign(&honest, &bob), sig.clone()]).is_ok());
        let lenient = TrustPolicy { accept_unverified: true, ..policy.clone() };
        assert_eq!(lenient.check(&lie, &[]).unwrap(), Verified::Unverified("unsigned".into()));
        assert!(lenient.check(&lie, &[sig]).is_err(), "a forged trusted signature is refused even then");
        let open = TrustPolicy::from_config(&[], None).unwrap();
        assert!(matches!(open.check(&lie, &[]).unwrap(), Verified::Unverified(_)));
    }
}
