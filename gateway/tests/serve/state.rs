//! The state directory (`--state-dir`): the usage database and the deployment key live there,
//! not in the working directory; the key is made once (readable by its user only) and kept
//! across restarts; a relative directory is warned about; replicas sharing limits with each
//! its own SQLite are refused.

use std::process::Command;

use super::common::*;

fn config() -> String {
    format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-state")
    )
}

#[test]
fn usage_and_the_deployment_key_live_in_the_state_directory() {
    let root = std::env::temp_dir().join(format!("cachet-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let state = root.join("state");
    let state_arg = state.to_str().unwrap().to_string();
    let key_path = state.join("hash-key");
    let mut keys = Vec::new();
    for round in 0..2 {
        let (server, base) = start_with(&config(), &["--state-dir", &state_arg]);
        let reply = chat_with_status(
            &base,
            "sk-state",
            r#"{"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}"#,
        );
        assert!(reply.ends_with("STATUS=200"), "round {round}: {reply}");
        drop(server);
        let key = std::fs::read_to_string(&key_path).unwrap();
        assert!(
            key.trim().len() == 64 && key.trim().bytes().all(|b| b.is_ascii_hexdigit()),
            "{key:?}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the key is its user's alone");
        keys.push(key);
        // The usage records went to the state directory's database.
        let db = state.join("usage.db");
        assert!(
            std::fs::metadata(&db).unwrap().len() > 0,
            "{}",
            db.display()
        );
    }
    assert_eq!(keys[0], keys[1], "the deployment key outlives a restart");
}

#[test]
fn a_relative_state_dir_is_warned_and_replicas_need_one_usage_store() {
    let root = std::env::temp_dir().join(format!("cachet-state-rel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let cfg = root.join("cachet.toml");
    // Two replicas sharing limits, each with its own SQLite: refused before anything starts
    // (Redis is not even asked).
    std::fs::write(
        &cfg,
        config() + "\n[shared_limits]\nredis_url = \"redis://127.0.0.1:1\"\nreplicas = 2\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .current_dir(&root)
        .arg("serve")
        .args(cachet_tests::SMOLLM2_CPU)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            "rel-state",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--state-dir rel-state is relative to the working directory"),
        "{err}"
    );
    assert!(
        err.contains("2 replicas") && err.contains("--usage-db postgres://"),
        "{err}"
    );
    assert!(root.join("rel-state/hash-key").exists());
}
