//! Key pairs in the user's config folder, and public keys as a workspace
//! lists them (`NAME:BASE64`, Nix's `trusted-public-keys` form).

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding};

use super::TrustError;

/// The largest key file read.
const MAX_KEY_FILE: u64 = 64 << 10;

/// The user's orchestrate config folder: `$ORCHESTRATE_CONFIG_DIR`, else
/// `$XDG_CONFIG_HOME/orchestrate`, else `~/.config/orchestrate`.
pub fn config_dir() -> Result<PathBuf, TrustError> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("ORCHESTRATE_CONFIG_DIR") {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CONFIG_HOME") {
        return Ok(dir.join("orchestrate"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".config").join("orchestrate")),
        None => {
            Err(TrustError("no config folder for keys: set ORCHESTRATE_CONFIG_DIR, XDG_CONFIG_HOME or HOME".into()))
        }
    }
}

/// Where the user's key pairs are.
pub fn keys_dir() -> Result<PathBuf, TrustError> {
    Ok(config_dir()?.join("keys"))
}

/// A key's name: what a signature says signed it, and what `trusted_keys`
/// lists before the colon (`alice`, `ci.example.org-1`).
pub fn check_name(name: &str) -> Result<(), TrustError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if ok {
        Ok(())
    } else {
        Err(TrustError(format!(
            "key name '{}': expected 1 to 64 letters, digits, '.', '_', '-' or '@', starting with a letter or digit",
            crate::ids::escaped(name)
        )))
    }
}

/// A public key with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub name: String,
    key: VerifyingKey,
}

impl PublicKey {
    /// Parses `NAME:BASE64` (the base64 of the key's SPKI DER, as
    /// `orchestrate key generate` and `key show` print it).
    pub fn parse(text: &str) -> Result<PublicKey, TrustError> {
        let bad = |why: &str| TrustError(format!("trusted key '{}': {why}", crate::ids::escaped(text)));
        let (name, b64) = text.trim().split_once(':').ok_or_else(|| bad("expected NAME:BASE64"))?;
        check_name(name)?;
        let der = B64.decode(b64).map_err(|_| bad("the part after ':' is not base64"))?;
        let key = VerifyingKey::from_public_key_der(&der).map_err(|_| bad("not a P-256 public key"))?;
        Ok(PublicKey { name: name.to_string(), key })
    }

    /// Reads a public key file (SPKI PEM, `NAME.pub`), named `name`.
    pub fn read_pem(path: &Path, name: &str) -> Result<PublicKey, TrustError> {
        let text = read_key_file(path)?;
        let key = VerifyingKey::from_public_key_pem(&text)
            .map_err(|_| TrustError(format!("{}: not a P-256 public key (SPKI PEM)", path.display())))?;
        Ok(PublicKey { name: name.to_string(), key })
    }

    /// A public key as a command line gives it: `NAME:BASE64`, a PEM file's
    /// path (`alice.pub`; its stem is its name), or a name in the user's key
    /// folder (`alice` reads `keys/alice.pub`).
    pub fn resolve(arg: &str) -> Result<PublicKey, TrustError> {
        if arg.contains('/') || arg.ends_with(".pub") || arg.ends_with(".pem") {
            let path = Path::new(arg);
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
            check_name(&name)?;
            return PublicKey::read_pem(path, &name);
        }
        if arg.contains(':') {
            return PublicKey::parse(arg);
        }
        check_name(arg)?;
        PublicKey::read_pem(&keys_dir()?.join(format!("{arg}.pub")), arg)
    }

    /// `NAME:BASE64`, the line a workspace lists under `trusted_keys`.
    pub fn to_line(&self) -> String {
        format!("{}:{}", self.name, B64.encode(self.spki_der()))
    }

    /// The key as SPKI PEM (what `model_signing verify key --public_key` reads).
    pub fn to_pem(&self) -> String {
        self.key.to_public_key_pem(LineEnding::LF).expect("a P-256 key encodes")
    }

    fn spki_der(&self) -> Vec<u8> {
        self.key.to_public_key_der().expect("a P-256 key encodes").into_vec()
    }

    /// Whether `signature` (DER, base64) is this key's over `message`.
    pub fn verifies(&self, message: &[u8], signature_b64: &str) -> bool {
        let Ok(der) = B64.decode(signature_b64) else { return false };
        self.verifies_der(message, &der)
    }

    /// Whether `der` (an ECDSA signature, DER) is this key's over `message`.
    pub fn verifies_der(&self, message: &[u8], der: &[u8]) -> bool {
        match Signature::from_der(der) {
            Ok(sig) => self.key.verify(message, &sig).is_ok(),
            Err(_) => false,
        }
    }
}

/// A signing key (the secret half), with its name.
pub struct SecretKey {
    pub name: String,
    key: SigningKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.name)
    }
}

impl SecretKey {
    /// A new key from the operating system's random source.
    pub fn generate(name: &str) -> Result<SecretKey, TrustError> {
        check_name(name)?;
        loop {
            let mut bytes = [0u8; 32];
            getrandom::getrandom(&mut bytes).map_err(|e| TrustError(format!("no randomness for a new key: {e}")))?;
            // Fails only for 0 or a value at or above the group order (about 2^-32).
            if let Ok(key) = SigningKey::from_slice(&bytes) {
                return Ok(SecretKey { name: name.to_string(), key });
            }
        }
    }

    /// Loads `NAME` from the user's key folder, or a PEM file given by path
    /// (its stem is then its name). A key file must be a regular file (not a
    /// link) that only its owner can read, as ssh requires.
    pub fn load(name_or_path: &str) -> Result<SecretKey, TrustError> {
        let (path, name) = if name_or_path.contains('/') || name_or_path.ends_with(".pem") {
            let path = PathBuf::from(name_or_path);
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
            (path, stem)
        } else {
            check_name(name_or_path)?;
            (keys_dir()?.join(format!("{name_or_path}.pem")), name_or_path.to_string())
        };
        check_name(&name)?;
        let meta = std::fs::symlink_metadata(&path).map_err(|e| {
            TrustError(format!(
                "signing key '{name}': {}: {e} (`orchestrate key generate {name}` makes one)",
                path.display()
            ))
        })?;
        if !meta.is_file() {
            return Err(TrustError(format!("{}: not a regular file (a key file may not be a link)", path.display())));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(TrustError(format!(
                "{}: a private key readable by others is refused (chmod 600 {})",
                path.display(),
                path.display()
            )));
        }
        let text = read_key_file(&path)?;
        let key = SigningKey::from_pkcs8_pem(&text)
            .or_else(|_| p256::SecretKey::from_sec1_pem(&text).map(SigningKey::from))
            .map_err(|_| TrustError(format!("{}: not a P-256 private key (PKCS#8 or SEC1 PEM)", path.display())))?;
        Ok(SecretKey { name, key })
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        PublicKey { name: self.name.clone(), key: *self.key.verifying_key() }
    }

    /// ECDSA P-256 / SHA-256 over `message`, DER.
    pub fn sign_der(&self, message: &[u8]) -> Vec<u8> {
        let sig: Signature = self.key.sign(message);
        let der: DerSignature = sig.to_der();
        der.as_bytes().to_vec()
    }

    /// The same, base64.
    pub fn sign(&self, message: &[u8]) -> String {
        B64.encode(self.sign_der(message))
    }

    /// Writes `NAME.pem` (mode 0600) and `NAME.pub` into `dir` (created mode
    /// 0700); an existing key is never overwritten, and nothing is written
    /// through a link. Returns the two paths.
    pub fn save(&self, dir: &Path) -> Result<(PathBuf, PathBuf), TrustError> {
        let io = |p: &Path, e: std::io::Error| TrustError(format!("{}: {e}", p.display()));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| io(dir, e))?;
        let meta = std::fs::symlink_metadata(dir).map_err(|e| io(dir, e))?;
        if !meta.is_dir() {
            return Err(TrustError(format!("{}: not a folder (a link is not followed)", dir.display())));
        }
        let secret = dir.join(format!("{}.pem", self.name));
        let public = dir.join(format!("{}.pub", self.name));
        for p in [&secret, &public] {
            if std::fs::symlink_metadata(p).is_ok() {
                return Err(TrustError(format!(
                    "key '{}' exists at {}: a key is never overwritten; choose another name",
                    self.name,
                    p.display()
                )));
            }
        }
        let pem = self.key.to_pkcs8_pem(LineEnding::LF).map_err(|e| TrustError(format!("encoding the key: {e}")))?;
        write_new(&secret, pem.as_bytes(), 0o600).map_err(|e| io(&secret, e))?;
        write_new(&public, self.public().to_pem().as_bytes(), 0o644).map_err(|e| io(&public, e))?;
        Ok((secret, public))
    }
}

/// Creates `path` (never an existing file or link) with `mode`, writes and syncs it.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Reads a key file: a regular file (not a link), at most 64 KiB, UTF-8.
fn read_key_file(path: &Path) -> Result<String, TrustError> {
    let err = |why: String| TrustError(format!("{}: {why}", path.display()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| err(format!("{e} (a key file may not be a link)")))?;
    let meta = f.metadata().map_err(|e| err(e.to_string()))?;
    if !meta.is_file() || meta.len() > MAX_KEY_FILE {
        return Err(err(format!("not a regular file of at most {MAX_KEY_FILE} bytes")));
    }
    let mut text = String::new();
    f.take(MAX_KEY_FILE).read_to_string(&mut text).map_err(|e| err(e.to_string()))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_signs_and_its_public_line_verifies_only_that_message() {
        let k = SecretKey::generate("alice").unwrap();
        let sig = k.sign(b"payload");
        let public = PublicKey::parse(&k.public().to_line()).unwrap();
        assert_eq!(public, k.public());
        assert!(public.verifies(b"payload", &sig));
        assert!(!public.verifies(b"payloaD", &sig));
        assert!(!SecretKey::generate("bob").unwrap().public().verifies(b"payload", &sig));
        assert!(!public.verifies(b"payload", "not base64!"));
    }

    #[test]
    fn a_saved_key_loads_back_and_is_never_overwritten_or_shared() {
        let dir = tempfile::tempdir().unwrap();
        let k = SecretKey::generate("alice").unwrap();
        let (secret, public) = k.save(dir.path()).unwrap();
        assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
        let loaded = SecretKey::load(secret.to_str().unwrap()).unwrap();
        assert_eq!(loaded.public(), k.public());
        assert_eq!(PublicKey::read_pem(&public, "alice").unwrap(), k.public());
        let again = k.save(dir.path()).unwrap_err().to_string();
        assert!(again.contains("never overwritten"), "{again}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let shared = SecretKey::load(secret.to_str().unwrap()).unwrap_err().to_string();
        assert!(shared.contains("readable by others"), "{shared}");
        let link = dir.path().join("link.pem");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let linked = SecretKey::load(link.to_str().unwrap()).unwrap_err().to_string();
        assert!(linked.contains("may not be a link"), "{linked}");
    }

    #[test]
    fn malformed_public_keys_and_names_are_refused_naming_what_is_wrong() {
        for (text, why) in [
            ("alice", "expected NAME:BASE64"),
            ("alice:!!!", "not base64"),
            ("alice:AAAA", "not a P-256 public key"),
            ("../x:AAAA", "key name"),
        ] {
            let e = PublicKey::parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
