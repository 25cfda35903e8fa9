//! Who vouches for a result: signing keys and signed cache records, as Nix's
//! binary caches sign narinfos (`trusted-public-keys`, `require-sigs`).
//!
//! A content hash proves that bytes are intact, not who produced them or
//! from what: anyone who can write to a shared bucket can edit a record so
//! that it names another valid object, and every check of bytes passes. A
//! signature binds a node's key (which covers every input) to the outputs
//! its signer got; a reader accepts a record only when a key it trusts
//! signed exactly that binding.
//!
//! | what | where |
//! |---|---|
//! | a key pair | the user's config folder (`$ORCHESTRATE_CONFIG_DIR`, else `$XDG_CONFIG_HOME/orchestrate`, else `~/.config/orchestrate`), `keys/NAME.pem` (PKCS#8, mode 0600) and `keys/NAME.pub` (SPKI); never in a workspace |
//! | a trusted key | `NAME:BASE64` (the SPKI DER of the public key), listed in the workspace's `config.yaml` under `trusted_keys` |
//! | a signature | ECDSA P-256 with SHA-256 (DER, base64) over [`record::signed_payload`]: the key and every output's name, kind, hash, size, file count and path |
//!
//! P-256 because OpenSSF model signing verifies it (`model_signing verify
//! key`), so the same key pair can sign a pack.

pub mod keys;
pub mod record;

pub use keys::{PublicKey, SecretKey};
pub use record::{RecordSignature, TrustPolicy, Verified};

/// A key or signature that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TrustError(pub String);
