//! The gateway's state directory (`--state-dir`): what must outlive a restart on this machine —
//! the usage database when `--usage-db` is not given, and the deployment key when
//! `--hash-key-file` is not — in one place an image can put on a volume, never the working
//! directory by accident.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The state directory: `given`, else `$XDG_STATE_HOME/cachet`, else `~/.local/state/cachet`;
/// created if missing. A relative one is warned about: it follows the working directory.
pub fn dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match given {
        Some(d) => d.to_path_buf(),
        None => match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
            Some(x) => PathBuf::from(x).join("cachet"),
            None => {
                let home = std::env::var_os("HOME").filter(|v| !v.is_empty()).context(
                    "no --state-dir, CACHET_STATE_DIR, XDG_STATE_HOME or HOME: give --state-dir",
                )?;
                PathBuf::from(home).join(".local/state/cachet")
            }
        },
    };
    warn_relative("--state-dir", &dir);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the state directory {}", dir.display()))?;
    Ok(dir)
}

/// The usage store's URL: `given`, else SQLite in the state directory. A relative SQLite path
/// is warned about.
pub fn usage_url(given: Option<&str>, state: &Path) -> String {
    let url = given.map_or_else(
        || format!("sqlite:{}", state.join("usage.db").display()),
        str::to_string,
    );
    if let Some(p) = url.strip_prefix("sqlite:") {
        warn_relative("--usage-db", Path::new(p));
    }
    url
}

/// The deployment key kept in `state/hash-key` (64 hex digits, readable by this user only),
/// made on the first start: the block hashes and tenants' cache salts stay the same across
/// restarts.
pub fn deployment_key(state: &Path) -> anyhow::Result<[u8; 32]> {
    let path = state.join("hash-key");
    match std::fs::metadata(&path) {
        Ok(_) => super::super::engine_args::read_hash_key(&path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).context("drawing a deployment key")?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            use std::io::Write;
            opts.open(&path)
                .and_then(|mut f| writeln!(f, "{}", cachet_gateway::tenants::hex(&key)))
                .with_context(|| format!("writing the deployment key {}", path.display()))?;
            tracing::info!(path = %path.display(), "deployment key made (the gateway's workers take it as --hash-key-file)");
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Replicas sharing limits through Redis must share usage records too: each one's own SQLite
/// would keep its own records and budgets, and a tenant could spend its budget once a replica.
pub fn check_shared(replicas: Option<u32>, usage_url: &str) -> anyhow::Result<()> {
    match replicas {
        Some(n) if n > 1 && usage_url.starts_with("sqlite:") => anyhow::bail!(
            "[shared_limits] says {n} replicas, but --usage-db is this replica's own SQLite ({usage_url}): \
             each would keep its own usage records and budgets. Give every replica the same \
             --usage-db postgres://…, or --usage-db off where no tenant has a budget"
        ),
        _ => Ok(()),
    }
}

fn warn_relative(flag: &str, p: &Path) {
    if p.is_relative() {
        let cwd = std::env::current_dir().unwrap_or_default();
        tracing::warn!(
            "{flag} {} is relative to the working directory ({}): give an absolute path",
            p.display(),
            cwd.display()
        );
    }
}
