//! Several models in one gateway: `--model` on the gateway's own engine (SmolLM2, CPU) and a
//! `[[model]]` (Qwen2.5-Coder-0.5B, served as `qwen`) run by a `cachet worker`; the official
//! `openai` client lists both, chats with each by name (each answer from its own model, with its
//! own tokenizer and length), and is refused a model it may not use or that is not there.

use std::process::{Command, Stdio};

use super::common::*;

#[test]
fn two_models_in_one_gateway_answer_by_name() {
    let _one = cachet_tests::one_real_model_at_a_time();
    cachet_tests::qwen05_path();
    let site = openai_site();
    let dir = std::env::temp_dir().join(format!("cachet-models-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("hash.key");
    std::fs::write(&key, "cd".repeat(32)).unwrap();
    let key = key.to_str().unwrap();
    let port = free_port();
    let log = dir.join("worker.log");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(["worker", "--model", "qwen2.5-coder-0.5b", "--device", "cpu"])
        .args(["--max-model-len", "1024", "--gpu-memory-utilization", "0.2"])
        .args([
            "--hash-key-file",
            key,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    cachet_tests::wait_proc_listening(&mut worker, "127.0.0.1", port, "cachet worker", &log);
    let _worker = KillOnDrop(worker);
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n\n\
         [[tenant]]\nid = \"smol\"\napi_key_sha256 = [\"{}\"]\nallowed_models = [\"smollm2\"]\n\n\
         [[model]]\nmodel = \"qwen2.5-coder-0.5b\"\nserved_model_name = [\"qwen\"]\nmax_model_len = 1024\n\
         [[model.upstream]]\nkind = \"cachet\"\nurl = \"http://127.0.0.1:{port}\"\n",
        key_hash("sk-acme"),
        key_hash("sk-smol"),
    );
    let (_server, base) = start_with(&config, &["--hash-key-file", key]);
    python_check(
        "models_check.py",
        &site,
        &[
            ("BASE_URL", &base),
            ("KEY", "sk-acme"),
            ("SMOL_KEY", "sk-smol"),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
