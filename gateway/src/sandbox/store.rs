//! Templates on disk, per tenant, versioned:
//!
//! ```text
//! <dir>/<tenant>/<name>/v<N>.wasm     every uploaded version (never rewritten)
//! <dir>/<tenant>/<name>/active        the active version number (replaced atomically)
//! ```
//!
//! Uploads are validated and compiled before they are written; activation is a rename, so a
//! reader sees the old version or the new one, never a mix. The index is rebuilt from the
//! directory at start-up, so templates survive a restart.
//!
//! Several gateway replicas may share the directory (a shared volume): the directory is the
//! truth and the index a cache of it. Each request reads its template's `active` file (one small
//! read), so once an activation returns on one replica no replica serves the old version; a
//! version or template another replica added is indexed when first named, listings and changes
//! rescan the template's directory first, and a version file is created only if absent, so two
//! replicas uploading at once get two version numbers.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{Compiled, Sandbox, TemplateError};

/// One stored version.
#[derive(Debug, Clone, Serialize)]
pub struct VersionInfo {
    pub version: u32,
    /// blake3 of the module bytes (hex).
    pub hash: String,
    pub size: usize,
    /// Upload time, seconds since the Unix epoch.
    pub created: u64,
    #[serde(skip)]
    raw_hash: [u8; 32],
}

/// A template and its versions, as listed by the admin API.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateInfo {
    pub name: String,
    pub active: Option<u32>,
    pub versions: Vec<VersionInfo>,
}

#[derive(Default)]
struct Entry {
    versions: BTreeMap<u32, VersionInfo>,
    active: Option<u32>,
}

/// How much one tenant may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Versions, across all the tenant's templates.
    pub versions: usize,
    /// Bytes of modules, across all its templates.
    pub bytes: usize,
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            versions: 64,
            bytes: 32 << 20,
        }
    }
}

/// All tenants' templates.
pub struct TemplateStore {
    dir: PathBuf,
    sandbox: Arc<Sandbox>,
    index: RwLock<HashMap<(String, String), Entry>>,
    quota: Quota,
}

fn storage(e: impl std::fmt::Display) -> TemplateError {
    TemplateError::Storage(e.to_string())
}

/// Template names: 1-64 of a-z, 0-9, `-`, `_`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Tenant ids become directory names: anything but [A-Za-z0-9_-] is hex-escaped.
fn tenant_dir(tenant: &str) -> String {
    tenant
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

fn untenant_dir(dir: &str) -> Option<String> {
    let mut out = Vec::new();
    let b = dir.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(dir.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Writes `bytes` to `path` whole, only if nothing is there (another replica's upload may have
/// taken the name): `Ok(false)` when it was.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    // A hard link never replaces an existing file (a rename would).
    let r = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// The version number of a file name `v<N>.wasm`.
fn version_of(fname: &str) -> Option<u32> {
    fname
        .strip_prefix('v')
        .and_then(|s| s.strip_suffix(".wasm"))
        .and_then(|s| s.parse::<u32>().ok())
}

/// A template's `active` file: the version it names, if any.
fn read_active(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("active"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The stored version at `path`: its size, hash and upload time.
fn version_info(version: u32, path: &Path) -> std::io::Result<VersionInfo> {
    let bytes = std::fs::read(path)?;
    let created = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let h = blake3::hash(&bytes);
    Ok(VersionInfo {
        version,
        hash: h.to_hex().to_string(),
        size: bytes.len(),
        created,
        raw_hash: *h.as_bytes(),
    })
}

/// `dir`'s template as it is on disk, reusing what `known` already read of unchanged versions.
fn scan(dir: &Path, known: Option<&Entry>) -> std::io::Result<Entry> {
    let mut entry = Entry::default();
    let files = match std::fs::read_dir(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(entry),
        Err(e) => return Err(e),
    };
    for f in files.flatten() {
        let Some(v) = version_of(&f.file_name().to_string_lossy()) else {
            continue;
        };
        let info = match known.and_then(|k| k.versions.get(&v)) {
            Some(i) => i.clone(),
            None => match version_info(v, &f.path()) {
                Ok(i) => i,
                // Deleted by another replica between the listing and the read.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            },
        };
        entry.versions.insert(v, info);
    }
    entry.active = read_active(dir).filter(|v| entry.versions.contains_key(v));
    Ok(entry)
}

impl TemplateStore {
    /// Opens (creating) `dir` and indexes what is there.
    pub fn open(dir: &Path, sandbox: Arc<Sandbox>) -> Result<TemplateStore, TemplateError> {
        std::fs::create_dir_all(dir).map_err(storage)?;
        let mut index = HashMap::new();
        for t in std::fs::read_dir(dir).map_err(storage)?.flatten() {
            let Some(tenant) = t.file_name().to_str().and_then(untenant_dir) else {
                continue;
            };
            let Ok(names) = std::fs::read_dir(t.path()) else {
                continue;
            };
            for n in names.flatten() {
                let Some(name) = n.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                if !valid_name(&name) {
                    continue;
                }
                let entry = scan(&n.path(), None).map_err(storage)?;
                if !entry.versions.is_empty() {
                    index.insert((tenant.clone(), name), entry);
                }
            }
        }
        Ok(TemplateStore {
            dir: dir.to_path_buf(),
            sandbox,
            index: RwLock::new(index),
            quota: Quota::default(),
        })
    }

    /// The same store with `quota` per tenant.
    pub fn with_quota(mut self, quota: Quota) -> Self {
        self.quota = quota;
        self
    }

    /// A tenant's stored versions and bytes.
    fn usage(index: &HashMap<(String, String), Entry>, tenant: &str) -> (usize, usize) {
        index
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .flat_map(|(_, e)| e.versions.values())
            .fold((0, 0), |(n, b), v| (n + 1, b + v.size))
    }

    /// Whether any template still uses the module of `hash` as its active version.
    fn active_anywhere(index: &HashMap<(String, String), Entry>, hash: &[u8; 32]) -> bool {
        index.values().any(|e| {
            e.active
                .and_then(|a| e.versions.get(&a))
                .is_some_and(|v| &v.raw_hash == hash)
        })
    }

    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    fn path(&self, tenant: &str, name: &str) -> PathBuf {
        self.dir.join(tenant_dir(tenant)).join(name)
    }

    /// Re-reads one template from the directory into `index` (other replicas may have changed
    /// it); a template gone from disk leaves the index.
    fn refresh(
        &self,
        index: &mut HashMap<(String, String), Entry>,
        tenant: &str,
        name: &str,
    ) -> Result<(), TemplateError> {
        let key = (tenant.to_string(), name.to_string());
        let entry = scan(&self.path(tenant, name), index.get(&key)).map_err(storage)?;
        if entry.versions.is_empty() {
            index.remove(&key);
        } else {
            index.insert(key, entry);
        }
        Ok(())
    }

    /// Validates, compiles and stores a new version; the first version of a template becomes
    /// active by itself.
    pub fn upload(
        &self,
        tenant: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<(VersionInfo, bool), TemplateError> {
        if !valid_name(name) {
            return Err(TemplateError::BadName(name.into()));
        }
        {
            let index = self.index.read().expect("index lock");
            let (n, b) = Self::usage(&index, tenant);
            if n + 1 > self.quota.versions || b + bytes.len() > self.quota.bytes {
                return Err(TemplateError::QuotaExceeded(format!(
                    "{n} versions of {} allowed, {b} + {} bytes of {} allowed; delete versions first",
                    self.quota.versions,
                    bytes.len(),
                    self.quota.bytes
                )));
            }
        }
        let compiled = self.sandbox.compile(bytes)?;
        let dir = self.path(tenant, name);
        std::fs::create_dir_all(&dir).map_err(storage)?;
        let mut index = self.index.write().expect("index lock");
        self.refresh(&mut index, tenant, name)?;
        let entry = index
            .entry((tenant.to_string(), name.to_string()))
            .or_default();
        let mut version = entry.versions.keys().next_back().map_or(1, |v| v + 1);
        // Another replica may take the number first: then the next one.
        while !write_new(&dir.join(format!("v{version}.wasm")), bytes).map_err(storage)? {
            version += 1;
        }
        // The refresh read the directory's `active` file: none (or a deleted version's) means
        // this first stored version serves.
        let activate = entry.active.is_none();
        let info = VersionInfo {
            version,
            hash: blake3::Hash::from_bytes(compiled.hash).to_hex().to_string(),
            size: bytes.len(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            raw_hash: compiled.hash,
        };
        entry.versions.insert(version, info.clone());
        if activate {
            write_atomically(&dir.join("active"), version.to_string().as_bytes())
                .map_err(storage)?;
            entry.active = Some(version);
        } else if !Self::active_anywhere(&index, &compiled.hash) {
            // Stored, not serving: its compiled code is not kept.
            self.sandbox.evict(&compiled.hash);
        }
        Ok((info, activate))
    }

    /// A tenant's templates, as the directory holds them now.
    pub fn list(&self, tenant: &str) -> Vec<TemplateInfo> {
        let mut index = self.index.write().expect("index lock");
        let mut names: Vec<String> = index
            .keys()
            .filter(|(t, _)| t == tenant)
            .map(|(_, n)| n.clone())
            .collect();
        if let Ok(dirs) = std::fs::read_dir(self.dir.join(tenant_dir(tenant))) {
            names.extend(
                dirs.flatten()
                    .filter_map(|d| d.file_name().to_str().map(str::to_string))
                    .filter(|n| valid_name(n)),
            );
        }
        names.sort();
        names.dedup();
        for n in &names {
            if let Err(e) = self.refresh(&mut index, tenant, n) {
                tracing::warn!(tenant, template = %n, error = %e, "re-reading a template");
            }
        }
        let mut out: Vec<TemplateInfo> = index
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|((_, name), e)| TemplateInfo {
                name: name.clone(),
                active: e.active,
                versions: e.versions.values().cloned().collect(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Makes `version` the one requests use, atomically.
    pub fn activate(&self, tenant: &str, name: &str, version: u32) -> Result<(), TemplateError> {
        let mut index = self.index.write().expect("index lock");
        self.refresh(&mut index, tenant, name)?;
        let entry = index
            .get_mut(&(tenant.to_string(), name.to_string()))
            .ok_or_else(|| TemplateError::NotFound(name.into()))?;
        if !entry.versions.contains_key(&version) {
            return Err(TemplateError::NoSuchVersion {
                name: name.into(),
                version,
            });
        }
        write_atomically(
            &self.path(tenant, name).join("active"),
            version.to_string().as_bytes(),
        )
        .map_err(storage)?;
        let before = entry
            .active
            .and_then(|a| entry.versions.get(&a))
            .map(|v| v.raw_hash);
        entry.active = Some(version);
        if let Some(h) = before {
            if !Self::active_anywhere(&index, &h) {
                self.sandbox.evict(&h);
            }
        }
        Ok(())
    }

    /// Deletes one version (not the active one) or, with `None`, the whole template.
    pub fn delete(
        &self,
        tenant: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<(), TemplateError> {
        let mut index = self.index.write().expect("index lock");
        self.refresh(&mut index, tenant, name)?;
        let key = (tenant.to_string(), name.to_string());
        let entry = index
            .get_mut(&key)
            .ok_or_else(|| TemplateError::NotFound(name.into()))?;
        let dir = self.path(tenant, name);
        let gone: Vec<[u8; 32]> = match version {
            None => entry.versions.values().map(|v| v.raw_hash).collect(),
            Some(v) => entry
                .versions
                .get(&v)
                .map(|i| i.raw_hash)
                .into_iter()
                .collect(),
        };
        match version {
            None => {
                std::fs::remove_dir_all(&dir).map_err(storage)?;
                index.remove(&key);
            }
            Some(v) => {
                if !entry.versions.contains_key(&v) {
                    return Err(TemplateError::NoSuchVersion {
                        name: name.into(),
                        version: v,
                    });
                }
                if entry.active == Some(v) {
                    return Err(TemplateError::VersionActive {
                        name: name.into(),
                        version: v,
                    });
                }
                std::fs::remove_file(dir.join(format!("v{v}.wasm"))).map_err(storage)?;
                entry.versions.remove(&v);
            }
        }
        // Their compiled code goes with them (unless another template serves the same bytes).
        for h in gone {
            if !Self::active_anywhere(&index, &h) {
                self.sandbox.evict(&h);
            }
        }
        Ok(())
    }

    /// The active version of a tenant's template, compiled (from the sandbox's cache when warm).
    /// The version is the one the directory's `active` file names now (another replica may
    /// have activated another since this one looked).
    pub fn resolve(&self, tenant: &str, name: &str) -> Result<Arc<Compiled>, TemplateError> {
        if !valid_name(name) {
            return Err(TemplateError::NotFound(name.into()));
        }
        let key = (tenant.to_string(), name.to_string());
        let on_disk = read_active(&self.path(tenant, name));
        let known = |index: &HashMap<(String, String), Entry>| {
            let e = index.get(&key)?;
            let v = on_disk.filter(|v| e.active == Some(*v))?;
            Some((v, e.versions.get(&v)?.raw_hash))
        };
        let found = known(&self.index.read().expect("index lock"));
        let (version, hash) = match found {
            Some(vh) => vh,
            None => {
                // Not indexed as the directory has it: added, activated or deleted elsewhere.
                let mut index = self.index.write().expect("index lock");
                self.refresh(&mut index, tenant, name)?;
                let e = index
                    .get(&key)
                    .ok_or_else(|| TemplateError::NotFound(name.into()))?;
                let v = e
                    .active
                    .ok_or_else(|| TemplateError::NotFound(name.into()))?;
                (v, e.versions[&v].raw_hash)
            }
        };

        if let Some(c) = self.sandbox.cached(&hash) {
            return Ok(c);
        }
        let bytes = std::fs::read(self.path(tenant, name).join(format!("v{version}.wasm")))
            .map_err(storage)?;
        self.sandbox.compile(&bytes)
    }
}
