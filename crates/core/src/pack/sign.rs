//! Signed packs in the OpenSSF model-signing format (`model-signing` 1.x),
//! so the ecosystem's own verifier checks them:
//!
//! ```sh
//! model_signing verify key PACK --signature PACK/model.sig --public_key alice.pub
//! ```
//!
//! `PACK/model.sig` is a Sigstore bundle (v0.3, JSON) whose verification
//! material is a public-key hint (SHA-256 of the key's SPKI PEM), holding a
//! DSSE envelope over an in-toto Statement v1: the subject is the pack (its
//! folder name, and a SHA-256 over every file's digest in name order), the
//! predicate (`https://model_signing/signature/v1.0`) lists every file of the
//! pack but the signature with its SHA-256 (`resources`) and how the list was
//! made (`serialization`: files, sha256, no links, `model.sig` ignored). Beside
//! them, a field v1.0 verifiers ignore, `orchestrate_provenance`, records
//! SLSA-style how the pack was made: the spec and its resolved form, every
//! node's key, op and version, the numerical environment and the git commit.
//! The signature is ECDSA P-256 / SHA-256 over DSSE's pre-authentication
//! encoding, as model-signing's `key` signer makes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::manifest::Manifest;
use super::PackError;
use crate::trust::{PublicKey, SecretKey};

/// The signature's file in the pack (model-signing's default name).
pub const SIGNATURE_FILE: &str = "model.sig";
/// The largest signature file read.
const MAX_SIGNATURE_BYTES: u64 = 64 << 20;

const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
const BUILD_TYPE: &str = "https://github.com/orchestrate/pack/v1";

/// A Sigstore bundle as model-signing writes one for a key.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    verification_material: VerificationMaterial,
    dsse_envelope: Envelope,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VerificationMaterial {
    public_key: PublicKeyHint,
    #[serde(default)]
    tlog_entries: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PublicKeyHint {
    hint: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Debug, Serialize, Deserialize)]
struct EnvelopeSignature {
    sig: String,
    #[serde(default)]
    keyid: String,
}

/// The in-toto statement.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    type_: String,
    subject: Vec<Subject>,
    predicate_type: String,
    predicate: Predicate,
}

#[derive(Debug, Serialize, Deserialize)]
struct Subject {
    name: String,
    digest: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Predicate {
    serialization: Serialization,
    resources: Vec<Resource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    orchestrate_provenance: Option<Provenance>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Serialization {
    method: String,
    hash_type: String,
    allow_symlinks: bool,
    #[serde(default)]
    ignore_paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Resource {
    name: String,
    algorithm: String,
    digest: String,
}

/// How the pack was made (SLSA provenance's build definition, in short).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub build_type: String,
    /// The spec, its profile, and its resolved form as it ran.
    pub spec: serde_json::Value,
    /// Every node: id, op, op version and key.
    pub nodes: Vec<ProvenanceNode>,
    /// The numerical environment and the git commit (the manifest's).
    pub environment: serde_json::Value,
    /// The pack's root digest (SHA-256 of SHA256SUMS), as `pack freeze` printed it.
    pub root_digest: String,
    pub frozen_at: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ProvenanceNode {
    pub id: String,
    pub op: String,
    pub op_version: u32,
    pub key: String,
}

/// What a good signature says.
#[derive(Debug)]
pub struct Signed {
    pub files: usize,
    pub key: String,
    pub root_digest: Option<String>,
}

/// DSSE's pre-authentication encoding of a payload.
fn pae(payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {PAYLOAD_TYPE} {} ", PAYLOAD_TYPE.len(), payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// model-signing's key hint: SHA-256 (hex) of the public key's SPKI PEM.
fn key_hint(key: &PublicKey) -> String {
    format!("{:x}", Sha256::digest(key.to_pem().as_bytes()))
}

/// Every file of the pack but the signature, with its SHA-256, in name order.
fn resources(dir: &Path) -> Result<Vec<Resource>, PackError> {
    let (files, others) = super::list_entries(dir)?;
    if let Some((path, what)) = others.iter().next() {
        return Err(PackError::Refused(format!("{path} is {what}: a pack holds only regular files")));
    }
    let mut out = Vec::new();
    for name in files.into_iter().filter(|f| f != SIGNATURE_FILE) {
        let digest = super::sha256_file(&dir.join(&name))?;
        out.push(Resource { name, algorithm: "sha256".into(), digest });
    }
    Ok(out)
}

/// SHA-256 over each resource's raw digest, in order: the subject's digest.
fn root_of(resources: &[Resource]) -> Result<String, String> {
    let mut h = Sha256::new();
    for r in resources {
        let raw: Vec<u8> = (0..r.digest.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(r.digest.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| format!("resource '{}': digest '{}' is not hex", r.name, r.digest))?;
        h.update(raw);
    }
    Ok(format!("{:x}", h.finalize()))
}

fn provenance(dir: &Path) -> Result<Provenance, PackError> {
    let m = Manifest::read(dir)?;
    Ok(Provenance {
        build_type: BUILD_TYPE.into(),
        spec: serde_json::json!({"name": m.spec.name, "path": m.spec.path, "profile": m.spec.profile, "resolved": m.spec.resolved}),
        nodes: m
            .nodes
            .iter()
            .map(|n| ProvenanceNode {
                id: n.id.clone(),
                op: n.op.clone(),
                op_version: n.op_version,
                key: n.key.to_string(),
            })
            .collect(),
        environment: serde_json::to_value(&m.environment).expect("an environment serializes"),
        root_digest: super::root_digest(dir)?,
        frozen_at: m.frozen_at,
    })
}

/// Signs an intact pack with `key`: writes `DIR/model.sig` (never over an
/// existing one). A pack with any problem is refused, naming them.
pub fn sign(dir: &Path, key: &SecretKey) -> Result<PathBuf, PackError> {
    let problems = super::verify(dir)?;
    if !problems.is_empty() {
        return Err(PackError::Refused(format!(
            "{}: not signed, the pack is not intact: {}",
            dir.display(),
            problems.join("; ")
        )));
    }
    let out = dir.join(SIGNATURE_FILE);
    if std::fs::symlink_metadata(&out).is_ok() {
        return Err(PackError::Refused(format!(
            "{}: the pack is signed already (a signature is never replaced)",
            out.display()
        )));
    }
    let resources = resources(dir)?;
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "pack".into());
    let statement = Statement {
        type_: STATEMENT_TYPE.into(),
        subject: vec![Subject {
            name,
            digest: BTreeMap::from([("sha256".to_string(), root_of(&resources).map_err(PackError::Refused)?)]),
        }],
        predicate_type: PREDICATE_TYPE.into(),
        predicate: Predicate {
            serialization: Serialization {
                method: "files".into(),
                hash_type: "sha256".into(),
                allow_symlinks: false,
                ignore_paths: vec![SIGNATURE_FILE.into()],
            },
            resources,
            orchestrate_provenance: Some(provenance(dir)?),
        },
    };
    let payload = serde_json::to_vec(&statement).expect("a statement serializes");
    let bundle = Bundle {
        media_type: BUNDLE_MEDIA_TYPE.into(),
        verification_material: VerificationMaterial {
            public_key: PublicKeyHint { hint: key_hint(&key.public()) },
            tlog_entries: Vec::new(),
        },
        dsse_envelope: Envelope {
            payload: B64.encode(&payload),
            payload_type: PAYLOAD_TYPE.into(),
            signatures: vec![EnvelopeSignature { sig: B64.encode(key.sign_der(&pae(&payload))), keyid: String::new() }],
        },
    };
    let bytes = serde_json::to_vec_pretty(&bundle).expect("a bundle serializes");
    crate::store::write_atomic(&out, &bytes)
        .map_err(|e| PackError::Refused(format!("writing {}: {e}", out.display())))?;
    Ok(out)
}

/// Checks `DIR/model.sig` against `key` and the pack's files as they are now:
/// the bundle's key hint, the signature over the envelope, the statement's
/// types, its subject digest, and every file's SHA-256 (a file added, removed
/// or changed since signing is named). `Err` lists what is wrong.
pub fn verify_signature(dir: &Path, key: &PublicKey) -> Result<Signed, Vec<String>> {
    let path = dir.join(SIGNATURE_FILE);
    let one = |m: String| vec![m];
    use crate::fsread::{read_bounded_file, BoundedFileError};
    let text = read_bounded_file(&path, MAX_SIGNATURE_BYTES).map_err(|e| match e {
        e if e.is_absent() => {
            one(format!("unsigned: the pack has no {SIGNATURE_FILE} (`orchestrate pack sign` writes one)"))
        }
        BoundedFileError::Io { source, .. } => one(format!("{SIGNATURE_FILE}: {source}")),
        BoundedFileError::NotAFile { .. } | BoundedFileError::TooLarge { .. } => {
            one(format!("{SIGNATURE_FILE} is not a regular file of at most {MAX_SIGNATURE_BYTES} bytes"))
        }
    })?;
    let bundle: Bundle =
        serde_json::from_slice(&text).map_err(|e| one(format!("{SIGNATURE_FILE} is not a Sigstore bundle: {e}")))?;
    if bundle.media_type != BUNDLE_MEDIA_TYPE {
        return Err(one(format!("{SIGNATURE_FILE}: media type '{}', expected {BUNDLE_MEDIA_TYPE}", bundle.media_type)));
    }
    if bundle.verification_material.public_key.hint != key_hint(key) {
        return Err(one(format!("{SIGNATURE_FILE} was signed by another key than '{}'", key.name)));
    }
    let envelope = &bundle.dsse_envelope;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(one(format!(
            "{SIGNATURE_FILE}: payload type '{}', expected {PAYLOAD_TYPE}",
            envelope.payload_type
        )));
    }
    let payload =
        B64.decode(&envelope.payload).map_err(|_| one(format!("{SIGNATURE_FILE}: the payload is not base64")))?;
    let good =
        envelope.signatures.iter().any(|s| B64.decode(&s.sig).is_ok_and(|der| key.verifies_der(&pae(&payload), &der)));
    if !good {
        return Err(one(format!("{SIGNATURE_FILE}: bad signature by key '{}' (the statement was altered)", key.name)));
    }
    let statement: Statement = serde_json::from_slice(&payload)
        .map_err(|e| one(format!("{SIGNATURE_FILE}: the payload is not an in-toto statement: {e}")))?;
    if statement.type_ != STATEMENT_TYPE || statement.predicate_type != PREDICATE_TYPE {
        return Err(one(format!(
            "{SIGNATURE_FILE}: statement type '{}' / predicate '{}', expected {STATEMENT_TYPE} / {PREDICATE_TYPE}",
            statement.type_, statement.predicate_type
        )));
    }
    let signed = &statement.predicate.resources;
    let root = root_of(signed).map_err(one)?;
    if statement.subject.len() != 1 || statement.subject[0].digest.get("sha256") != Some(&root) {
        return Err(one(format!("{SIGNATURE_FILE}: the subject's digest is not that of its resources")));
    }
    let now = resources(dir).map_err(|e| one(e.to_string()))?;
    let signed_by_name: BTreeMap<&str, &Resource> = signed.iter().map(|r| (r.name.as_str(), r)).collect();
    let now_by_name: BTreeMap<&str, &Resource> = now.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut problems = Vec::new();
    for (name, r) in &signed_by_name {
        match now_by_name.get(name) {
            None => problems.push(format!("signed file {name} is missing from the pack")),
            Some(n) if n.digest != r.digest || r.algorithm != "sha256" => problems
                .push(format!("{name} changed since the pack was signed (sha256 {}, signed {})", n.digest, r.digest)),
            Some(_) => {}
        }
    }
    for name in now_by_name.keys().filter(|n| !signed_by_name.contains_key(*n)) {
        problems.push(format!("{name} was added after the pack was signed"));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Signed {
        files: signed.len(),
        key: key.name.clone(),
        root_digest: statement.predicate.orchestrate_provenance.map(|p| p.root_digest),
    })
}
