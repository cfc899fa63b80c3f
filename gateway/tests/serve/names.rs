//! `--served-model-name` against a real `cachet serve` (SmolLM2 on the CPU): clients use any
//! served name; `/v1/models` lists each with the model's length; responses carry the first;
//! a tenant's `allowed_models` and a `[[price]]` (here a budget that needs one) take a served
//! name; the model's own name is no longer one; bad names are refused at start.

use cachet_tests::curl_status;

use super::common::*;

#[test]
fn clients_use_the_served_names() {
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\nallowed_models = [\"small\"]\n\
         budget_usd = 10.0\n\n[[price]]\nmodel = \"small\"\ninput_per_mtok = 0.1\noutput_per_mtok = 0.2\n",
        key_hash("sk-test-acme")
    );
    let (_server, base) = start_with(
        &config,
        &[
            "--served-model-name",
            "org/SmolLM2-135M",
            "small",
            "--max-model-len",
            "1024",
        ],
    );
    let auth = "Authorization: Bearer sk-test-acme";
    let (code, models) = curl_status(&["-H", auth, &format!("{base}/v1/models")]);
    assert_eq!(code, 200, "{models}");
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["org/SmolLM2-135M", "small"], "{models}");
    assert!(models["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["max_model_len"] == 1024));
    let chat = |model: &str| {
        let body = serde_json::json!({"model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}]})
        .to_string();
        let (code, text) = curl_status(&[
            "-H",
            auth,
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
            &format!("{base}/v1/chat/completions"),
        ]);
        (
            code,
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        )
    };
    for name in ["small", "org/SmolLM2-135M"] {
        let (code, v) = chat(name);
        assert_eq!(code, 200, "{name}: {v}");
        assert_eq!(v["model"], "org/SmolLM2-135M", "{v}");
    }
    let (code, v) = chat("smollm2");
    assert_eq!(code, 404, "{v}");
    // Names that cannot be served are refused at start.
    for bad in [
        &["--served-model-name", "a", "a"][..],
        &["--served-model-name", "has space"],
    ] {
        let dir = std::env::temp_dir().join(format!("cachet-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("t.toml");
        std::fs::write(&cfg, &config).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachet"))
            .arg("serve")
            .args(cachet_tests::SMOLLM2_CPU)
            .args(["--listen", "127.0.0.1:0", "--usage-db", "off", "--config"])
            .arg(&cfg)
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--served-model-name"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Without --max-model-len the model's own context serves (SmolLM2's 8192), lowered to what the
/// KV cache holds where it holds less — said in the log; a given length is kept.
#[test]
fn the_length_defaults_to_the_models_own_within_the_cache() {
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-len")
    );
    let length = |extra: &[&str]| {
        let dir = std::env::temp_dir().join(format!("cachet-len-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("serve.log");
        let (server, base) = start_under(&config, extra, None, Some(&log));
        let (code, models) = curl_status(&[
            "-H",
            "Authorization: Bearer sk-len",
            &format!("{base}/v1/models"),
        ]);
        assert_eq!(code, 200, "{models}");
        let models: serde_json::Value = serde_json::from_str(&models).unwrap();
        drop(server);
        // The log's text, its colours taken out.
        let mut log = std::fs::read_to_string(&log).unwrap();
        while let Some(at) = log.find('\x1b') {
            let end = log[at..].find('m').map_or(log.len(), |e| at + e + 1);
            log.replace_range(at..end, "");
        }
        let _ = std::fs::remove_dir_all(&dir);
        (models["data"][0]["max_model_len"].as_u64().unwrap(), log)
    };
    let (own, log) = length(&[]);
    assert_eq!(own, 8192, "SmolLM2's max_position_embeddings");
    assert!(!log.contains("max_model_len lowered"), "{log}");
    // 40 blocks of 16 tokens hold 640.
    let (held, log) = length(&["--num-gpu-blocks-override", "40"]);
    assert_eq!(held, 640);
    assert!(
        log.contains("max_model_len lowered") && log.contains("kv_cache_tokens=640"),
        "{log}"
    );
    let (given, _) = length(&["--num-gpu-blocks-override", "40", "--max-model-len", "512"]);
    assert_eq!(given, 512);
}
