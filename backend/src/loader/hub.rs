//! Models by Hugging Face id (`org/name`, or `org/name/FILE.gguf` for one file of a GGUF repo),
//! downloaded with hf-hub into the Hub cache that transformers, vLLM and huggingface_hub share.
//!
//! The environment is read as huggingface_hub reads it: `HF_ENDPOINT`, `HF_TOKEN` (else the file
//! `HF_TOKEN_PATH`, else `$HF_HOME/token`), `HF_HUB_CACHE` (else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`) and `HF_HUB_OFFLINE`. A download resumes where an earlier one
//! stopped (in the same run after a dropped connection, or in the next run), and every file
//! downloaded is checked against the hash the Hub names it by (sha256 of an LFS file, the git blob
//! sha1 of a small one) before it is used; a file that does not match is deleted.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Repo, RepoType};

pub use crate::error::HubError;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where and how the Hub is reached.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub endpoint: String,
    /// The cache holding `models--org--name/{blobs,snapshots,refs}`.
    pub cache: PathBuf,
    pub token: Option<String>,
    /// Where the token came from, for errors: `HF_TOKEN` or the token file's path.
    pub token_from: Option<String>,
    /// Only the cache is read (`HF_HUB_OFFLINE`).
    pub offline: bool,
    /// Progress bars on stderr.
    pub progress: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl HubConfig {
    /// The Hub as the environment describes it (see the module's documentation).
    pub fn from_env(progress: bool) -> Self {
        let home = env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let token_path = env("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("token"));
        let (token, token_from) = match env("HF_TOKEN") {
            Some(t) => (Some(t), Some("HF_TOKEN".to_string())),
            None => match std::fs::read_to_string(&token_path) {
                Ok(t) if !t.trim().is_empty() => (
                    Some(t.trim().to_string()),
                    Some(token_path.display().to_string()),
                ),
                _ => (None, None),
            },
        };
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
        });
        HubConfig {
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .to_string(),
            cache: env("HF_HUB_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join("hub")),
            token,
            token_from,
            offline,
            progress,
        }
    }
}

/// A model named by its Hub id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    /// `org/name`
    pub repo: String,
    /// One GGUF file of the repo, where the spec names it.
    pub gguf_file: Option<String>,
}

impl HubModel {
    /// `spec` as a Hub id: `org/name` or `org/name/FILE.gguf`, where no such local path exists.
    pub fn parse(spec: &str) -> Option<HubModel> {
        if Path::new(spec).exists() {
            return None;
        }
        let parts: Vec<&str> = spec.split('/').collect();
        let word = |s: &str| {
            !s.is_empty()
                && !s.starts_with(['.', '-'])
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        match parts.as_slice() {
            [org, name] if word(org) && word(name) => Some(HubModel {
                repo: spec.to_string(),
                gguf_file: None,
            }),
            [org, name, file]
                if word(org) && word(name) && word(file) && file.ends_with(".gguf") =>
            {
                Some(HubModel {
                    repo: format!("{org}/{name}"),
                    gguf_file: Some(file.to_string()),
                })
            }
            _ => None,
        }
    }
}

/// Which of a repo's files are needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// `config.json` (random weights of the model's shape).
    Config,
    /// The config, tokenizer, chat templates and generation defaults (text without the weights).
    Text,
    /// Everything the engine reads, weights included.
    Model,
}

const TEXT_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// The files of `listing` that `want` needs, and the GGUF file to load where the model is one.
fn select(
    model: &HubModel,
    listing: &[String],
    want: Want,
) -> Result<(Vec<String>, Option<String>), HubError> {
    let show = || listing.join(", ");
    let ggufs: Vec<&String> = listing.iter().filter(|f| f.ends_with(".gguf")).collect();
    let gguf = match &model.gguf_file {
        Some(f) if !listing.contains(f) => {
            return Err(HubError::NoFile {
                repo: model.repo.clone(),
                file: f.clone(),
                listing: show(),
            })
        }
        Some(f) => Some(f.clone()),
        None if !listing.iter().any(|f| f == "config.json") && ggufs.len() == 1 => {
            Some(ggufs[0].clone())
        }
        None if !listing.iter().any(|f| f == "config.json") && ggufs.len() > 1 => {
            return Err(HubError::WhichGguf {
                repo: model.repo.clone(),
                files: ggufs
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
        None => None,
    };
    if let Some(file) = gguf {
        // A GGUF file holds its config, tokenizer and chat template.
        return Ok((vec![file.clone()], Some(file)));
    }
    if !listing.iter().any(|f| f == "config.json") {
        return Err(HubError::NoFile {
            repo: model.repo.clone(),
            file: "config.json".into(),
            listing: show(),
        });
    }
    let mut files: Vec<String> = listing
        .iter()
        .filter(|f| match want {
            Want::Config => f.as_str() == "config.json",
            Want::Text | Want::Model => {
                TEXT_FILES.contains(&f.as_str())
                    || (f.starts_with("additional_chat_templates/") && f.ends_with(".jinja"))
            }
        })
        .cloned()
        .collect();
    if want == Want::Model {
        let weights: Vec<String> = listing
            .iter()
            .filter(|f| {
                !f.contains('/')
                    && (f.ends_with(".safetensors") || f.as_str() == "model.safetensors.index.json")
            })
            .cloned()
            .collect();
        if weights.is_empty() {
            return Err(HubError::NoWeights {
                repo: model.repo.clone(),
                listing: show(),
            });
        }
        files.extend(weights);
    }
    Ok((files, None))
}

/// The repo's folder in the cache: `models--org--name`.
fn repo_dir(cfg: &HubConfig, repo: &str) -> PathBuf {
    cfg.cache
        .join(format!("models--{}", repo.replace('/', "--")))
}

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The cached snapshot of `revision`, where the cache holds one with `needed` in it.
fn cached(cfg: &HubConfig, model: &HubModel, revision: &str, needed: &str) -> Option<PathBuf> {
    let dir = repo_dir(cfg, &model.repo);
    let commit = if is_commit(revision) {
        revision.to_string()
    } else {
        std::fs::read_to_string(dir.join("refs").join(revision))
            .ok()?
            .trim()
            .to_string()
    };
    let snapshot = dir.join("snapshots").join(commit);
    snapshot.join(needed).exists().then_some(snapshot)
}

/// `model` at `revision` on this machine: downloaded into the cache unless it is there already;
/// returns the path to load (the snapshot directory, or its GGUF file).
pub fn download(
    cfg: &HubConfig,
    model: &HubModel,
    revision: &str,
    want: Want,
) -> Result<PathBuf, HubError> {
    let needed = model.gguf_file.as_deref().unwrap_or("config.json");
    let not_cached = || HubError::NotCached {
        repo: model.repo.clone(),
        revision: revision.into(),
        cache: cfg.cache.clone(),
    };
    // The snapshot directory, or its GGUF file.
    let load = |snapshot: PathBuf| match &model.gguf_file {
        Some(f) => snapshot.join(f),
        None => snapshot,
    };
    if cfg.offline {
        return cached(cfg, model, revision, needed)
            .map(load)
            .ok_or_else(not_cached);
    }
    let api = ApiBuilder::new()
        .with_endpoint(cfg.endpoint.clone())
        .with_cache_dir(cfg.cache.clone())
        .with_token(cfg.token.clone())
        .with_progress(cfg.progress)
        .with_retries(5)
        .with_user_agent("cachet", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| request_error(cfg, model, revision, "starting the client", e))?;
    let info = match api
        .repo(Repo::with_revision(
            model.repo.clone(),
            RepoType::Model,
            revision.into(),
        ))
        .info()
    {
        Ok(info) => info,
        Err(e) if status(&e).is_none() => {
            // The Hub is unreachable: a cached snapshot serves, as huggingface_hub does.
            if let Some(snapshot) = cached(cfg, model, revision, needed) {
                tracing::warn!(repo = %model.repo, error = %e, "the Hub is unreachable; using the cached snapshot");
                return Ok(load(snapshot));
            }
            return Err(request_error(cfg, model, revision, "listing its files", e));
        }
        Err(e) => return Err(request_error(cfg, model, revision, "listing its files", e)),
    };
    let listing: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let (files, gguf) = select(model, &listing, want)?;
    // Every file from the one commit the listing came from, into its snapshot.
    let repo = api.repo(Repo::with_revision(
        model.repo.clone(),
        RepoType::Model,
        info.sha.clone(),
    ));
    let dir = repo_dir(cfg, &model.repo);
    let snapshot = dir.join("snapshots").join(&info.sha);
    for file in &files {
        if snapshot.join(file).exists() {
            continue;
        }
        let path = repo
            .download(file)
            .map_err(|e| request_error(cfg, model, revision, &format!("downloading {file}"), e))?;
        // hf-hub leaves its lock beside the blob (huggingface_hub keeps its own elsewhere).
        if let Ok(blob) = std::fs::canonicalize(&path) {
            let _ = std::fs::remove_file(blob.with_extension("lock"));
        }
        verify(cfg, model, file, &path)?;
    }
    if revision != info.sha {
        // hf-hub notes the commit it downloaded as a ref named by itself; the ref a user names
        // is the revision they asked for, as huggingface_hub writes it.
        let _ = std::fs::remove_file(dir.join("refs").join(&info.sha));
        let refs = dir.join("refs").join(revision);
        if let Some(parent) = refs.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&refs, &info.sha).map_err(io(&refs))?;
    }
    Ok(match gguf {
        Some(f) => snapshot.join(f),
        None => snapshot,
    })
}

/// The HTTP status of a failed request, if the server answered.
fn status(e: &ApiError) -> Option<u16> {
    match e {
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::StatusCode(code) => Some(*code),
            _ => None,
        },
        ApiError::TooManyRetries(e) => status(e),
        _ => None,
    }
}

fn request_error(
    cfg: &HubConfig,
    model: &HubModel,
    revision: &str,
    what: &str,
    e: ApiError,
) -> HubError {
    let repo = model.repo.clone();
    let endpoint = cfg.endpoint.clone();
    match (status(&e), &cfg.token_from) {
        (Some(401), _) | (Some(403), None) => HubError::NeedsToken { repo, endpoint },
        (Some(403), Some(from)) => HubError::NoAccess {
            repo,
            endpoint,
            token_from: from.clone(),
        },
        (Some(404), _) if what == "listing its files" => HubError::NotFound {
            repo,
            revision: revision.into(),
            endpoint,
        },
        _ => HubError::Request {
            repo,
            what: what.into(),
            endpoint,
            source: Box::new(e),
        },
    }
}

/// Checks a downloaded file against the hash the Hub names it by (its blob's name): sha256 for
/// an LFS file, the git blob sha1 for a small one. A mismatch deletes the blob and its link.
fn verify(cfg: &HubConfig, model: &HubModel, file: &str, link: &Path) -> Result<(), HubError> {
    let blob = std::fs::canonicalize(link).map_err(io(link))?;
    let expected = blob
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    use super::fetch::{digest_file, hex};
    let (algorithm, got) = match expected.len() {
        64 => (
            "sha256",
            digest_file::<sha2::Sha256>(&blob, None, cfg.progress),
        ),
        40 => {
            let len = std::fs::metadata(&blob).map_err(io(&blob))?.len();
            let prefix = format!("blob {len}\0");
            let d = digest_file::<sha1::Sha1>(&blob, Some(prefix.as_bytes()), false);
            ("git blob sha1", d)
        }
        _ => {
            tracing::warn!(repo = %model.repo, file, etag = %expected, "the Hub gave no hash to check this file against");
            return Ok(());
        }
    };
    let got = hex(&got.map_err(io(&blob))?);
    if got == expected {
        return Ok(());
    }
    let _ = std::fs::remove_file(link);
    let _ = std::fs::remove_file(&blob);
    Err(HubError::HashMismatch {
        repo: model.repo.clone(),
        file: file.into(),
        algorithm,
        expected,
        got,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ids_are_told_from_paths() {
        let m = HubModel::parse("Qwen/Qwen3-8B").unwrap();
        assert_eq!((m.repo.as_str(), m.gguf_file), ("Qwen/Qwen3-8B", None));
        let g =
            HubModel::parse("Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")
                .unwrap();
        assert_eq!(g.repo, "Qwen/Qwen2.5-0.5B-Instruct-GGUF");
        for not in [
            "smollm2",
            "/abs/path",
            "./rel/dir",
            "a/b/c",
            "a/b/c/d.gguf",
            "a//b",
            "../x/y",
            "a/b c",
        ] {
            assert_eq!(HubModel::parse(not), None, "{not}");
        }
    }

    #[test]
    fn the_files_needed_are_chosen_from_the_listing() {
        let m = HubModel::parse("org/model").unwrap();
        let listing = names(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "onnx/model.onnx",
            "additional_chat_templates/tool_use.jinja",
        ]);
        let (files, load) = select(&m, &listing, Want::Model).unwrap();
        assert_eq!(load, None);
        assert!(files.contains(&"model-00002-of-00002.safetensors".into()));
        assert!(files.contains(&"additional_chat_templates/tool_use.jinja".into()));
        assert!(!files
            .iter()
            .any(|f| f.ends_with(".bin") || f.ends_with(".onnx") || f == "README.md"));
        let (text, _) = select(&m, &listing, Want::Text).unwrap();
        assert!(!text.iter().any(|f| f.ends_with(".safetensors")));
        assert_eq!(
            select(&m, &listing, Want::Config).unwrap().0,
            names(&["config.json"])
        );

        let bin_only = names(&["config.json", "pytorch_model.bin"]);
        let e = select(&m, &bin_only, Want::Model).unwrap_err().to_string();
        assert!(
            e.contains("no safetensors or GGUF") && e.contains("pytorch_model.bin"),
            "{e}"
        );

        let ggufs = names(&["README.md", "m-q4_k_m.gguf", "m-q8_0.gguf"]);
        let e = select(&m, &ggufs, Want::Model).unwrap_err().to_string();
        assert!(
            e.contains("org/model/FILE.gguf") && e.contains("m-q8_0.gguf"),
            "{e}"
        );
        let one = HubModel::parse("org/model/m-q8_0.gguf").unwrap();
        assert_eq!(
            select(&one, &ggufs, Want::Text).unwrap(),
            (names(&["m-q8_0.gguf"]), Some("m-q8_0.gguf".into()))
        );
        let missing = HubModel::parse("org/model/m-f16.gguf").unwrap();
        assert!(select(&missing, &ggufs, Want::Model)
            .unwrap_err()
            .to_string()
            .contains("has no `m-f16.gguf`"));
    }
}
