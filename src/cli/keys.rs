//! `orchestrate key`: signing keys in the user's config folder, and the
//! trust a remote is opened with (`trusted_keys`, `--trust-unsigned`, `--key`).

use super::exit::Status;

use anyhow::{bail, Result};

use super::{KeyCommand, TrustArgs};
use orchestrate_core::remote;
use orchestrate_core::trust::{keys, PublicKey, SecretKey};

pub fn key(cmd: KeyCommand) -> Result<Status> {
    match cmd {
        KeyCommand::Generate { name } => {
            let key = SecretKey::generate(&name)?;
            let (secret, public) = key.save(&keys::keys_dir()?)?;
            eprintln!("wrote {} (private: keep it; mode 0600) and {}", secret.display(), public.display());
            eprintln!(
                "to trust records this key signs, list this line under `trusted_keys:` in a workspace's config.yaml:"
            );
            println!("{}", key.public().to_line());
        }
        KeyCommand::Show { name, pem } => {
            keys::check_name(&name)?;
            let path = keys::keys_dir()?.join(format!("{name}.pub"));
            let public = PublicKey::read_pem(&path, &name)?;
            if pem {
                print!("{}", public.to_pem());
            } else {
                println!("{}", public.to_line());
            }
        }
    }
    Ok(Status::Ok)
}

/// Opens the remote `url` (or the configured one) with the workspace's trust
/// policy; with `signing`, also the key that pushes sign with: `--key`, else
/// `ORCHESTRATE_SIGNING_KEY`, else the config's `signing_key`.
pub fn open_remote(
    workspace: &std::path::Path,
    url: Option<&str>,
    jobs: Option<usize>,
    trust: &TrustArgs,
    signing: bool,
) -> Result<remote::Remote> {
    let given = url.filter(|u| !u.is_empty());
    let config = remote::read_config(workspace)?;
    let Some((parsed, configured_jobs)) = remote::resolve(given, &config)? else {
        bail!(
            "no remote: give --remote s3://BUCKET/PREFIX (or file:///PATH), set ORCHESTRATE_REMOTE, or add \
             `remote: {{url: ...}}` to {}",
            remote::config_path(workspace).display()
        );
    };
    let mut policy = config.trust(workspace)?;
    policy.accept_unverified = trust.trust_unsigned;
    let signer = if signing {
        let named = trust
            .key
            .clone()
            .or_else(|| std::env::var("ORCHESTRATE_SIGNING_KEY").ok().filter(|k| !k.is_empty()))
            .or(config.signing_key);
        named.map(|k| SecretKey::load(&k)).transpose()?
    } else {
        None
    };
    Ok(remote::Remote::open(parsed, jobs.or(configured_jobs).unwrap_or(8))?.with_trust(policy).with_signer(signer))
}

/// `pack sign DIR --key K`.
pub fn sign_pack(dir: &std::path::Path, key: &str) -> Result<Status> {
    let key = SecretKey::load(key)?;
    let path = orchestrate_core::pack::sign::sign(dir, &key)?;
    println!("signed {} with key '{}': {}", dir.display(), key.name, path.display());
    println!(
        "verify: orchestrate audit {} --key {}   or   model_signing verify key {} --signature {} --public_key {}.pub",
        dir.display(),
        key.name,
        dir.display(),
        path.display(),
        key.name
    );
    Ok(Status::Ok)
}

/// The problems of a pack's signature by `key` (printed as they are found),
/// or a line saying it is good.
pub fn pack_signature(dir: &std::path::Path, key: &str) -> Result<Vec<String>> {
    let key = PublicKey::resolve(key)?;
    match orchestrate_core::pack::sign::verify_signature(dir, &key) {
        Ok(signed) => {
            println!(
                "signed by key '{}': {} files, each as signed{}",
                signed.key,
                signed.files,
                signed.root_digest.map(|d| format!(" (root digest {d})")).unwrap_or_default()
            );
            Ok(Vec::new())
        }
        Err(problems) => {
            for p in &problems {
                eprintln!("signature: {p}");
            }
            Ok(problems)
        }
    }
}
