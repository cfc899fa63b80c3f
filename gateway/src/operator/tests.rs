use std::time::Instant;

use super::*;
use crate::tenants::{hash_key, hex, Denied, TenantRegistry};

const DEPLOYMENT: [u8; 32] = [9; 32];

fn config(url: &str) -> OperatorConfig {
    OperatorConfig {
        database: Some(url.to_string()),
        database_env: None,
        key: vec![OperatorKey {
            name: "alice".into(),
            sha256: hex(&hash_key("op-key")),
        }],
        poll_ms: None,
    }
}

fn file_tenants() -> Vec<TenantConfig> {
    let text = format!(
        "[[tenant]]\nid = \"boot\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = 60\n",
        hex(&hash_key("sk-boot"))
    );
    crate::config::ConfigFile::parse(&text).unwrap().tenant
}

fn validate(t: Vec<TenantConfig>) -> Result<(), crate::tenants::InvalidTenant> {
    TenantRegistry::from_store(t, &DEPLOYMENT, Instant::now(), None, None).map(|_| ())
}

fn registry(op: &Operator) -> TenantRegistry {
    TenantRegistry::from_store(
        op.snapshot().unwrap().tenants,
        &DEPLOYMENT,
        Instant::now(),
        None,
        None,
    )
    .unwrap()
}

fn obj(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().unwrap().clone()
}

/// Every text column of every table (a key must never be in any).
fn all_text(url: &str) -> String {
    let mut c = crate::db::Conn::open(url).unwrap();
    let mut out = String::new();
    for t in ["cachet_tenants", "cachet_keys", "cachet_audit"] {
        for row in c.query(&format!("SELECT * FROM {t}"), &[]).unwrap() {
            for v in row {
                out.push_str(v.text());
                out.push('\n');
            }
        }
    }
    out
}

/// The whole life of a store: bootstrap, create, update, suspend, keys, audit, a reopen.
fn exercise(url: &str) {
    let op = Operator::open(config(url)).unwrap();
    assert!(
        op.bootstrap(&file_tenants()).unwrap(),
        "first start imports"
    );
    assert!(!op.bootstrap(&file_tenants()).unwrap(), "and only then");
    assert_eq!(op.revision().unwrap(), 1);
    let reg = registry(&op);
    assert_eq!(reg.authenticate("sk-boot").unwrap().id(), "boot");
    assert_eq!(
        reg.authenticate("sk-boot")
            .unwrap()
            .config
            .requests_per_minute,
        Some(60)
    );

    // A tenant and its first key: shown once, only its hash stored.
    let a = op
        .apply(
            "alice",
            Change::Create {
                settings: obj(
                    serde_json::json!({"id": "acme", "requests_per_minute": 600, "share": 2.0}),
                ),
                key_label: "prod".into(),
            },
            &validate,
        )
        .unwrap();
    assert_eq!(a.revision, 2);
    let key = a.key.unwrap();
    assert!(key.key.starts_with("sk-cachet-") && key.key.len() == 10 + 48);
    let sha = hex(&hash_key(&key.key));
    assert_eq!(key.key_id, sha[..12]);
    let text = all_text(url);
    assert!(!text.contains(&key.key), "the key itself is stored nowhere");
    assert!(text.contains(&sha), "its hash is");
    let reg = registry(&op);
    let t = reg.authenticate(&key.key).unwrap();
    assert_eq!((t.id(), t.config.share), ("acme", 2.0));
    refusals(&op);
    update_and_suspend(&op, &key);
    let admin = admin_and_rotated_keys(&op, &key);
    audit_and_reopen(op, url, &admin);
}

/// Refused changes name the field and write nothing.
fn refusals(op: &Operator) {
    let refuse = |c: Change| op.apply("alice", c, &validate).unwrap_err();
    let e = refuse(Change::Update {
        id: "acme".into(),
        patch: obj(serde_json::json!({"share": 0.0})),
    });
    assert!(e.to_string().contains("share must be 0.01 to 1000"), "{e}");
    let e = refuse(Change::Update {
        id: "acme".into(),
        patch: obj(serde_json::json!({"requests_per_minut": 5})),
    });
    assert!(
        matches!(&e, OpError::Invalid { field: Some(f), .. } if f == "requests_per_minut"),
        "{e:?}"
    );
    let e = refuse(Change::Update {
        id: "acme".into(),
        patch: obj(serde_json::json!({"api_key_sha256": ["00"]})),
    });
    assert!(
        e.to_string()
            .contains("POST /operator/v1/tenants/{id}/keys"),
        "{e}"
    );
    assert!(matches!(
        refuse(Change::Create {
            settings: obj(serde_json::json!({"id": "acme"})),
            key_label: String::new()
        }),
        OpError::Exists(_)
    ));
    assert!(matches!(
        refuse(Change::Delete {
            id: "nobody".into()
        }),
        OpError::NoTenant(_)
    ));
    assert_eq!(op.revision().unwrap(), 2, "refusals leave no revision");
}

/// An update (null returns a field to its default); a suspension refuses both kinds of key and
/// resuming restores them.
fn update_and_suspend(op: &Operator, key: &NewKey) {
    op.apply(
        "alice",
        Change::Update {
            id: "acme".into(),
            patch: obj(serde_json::json!({"requests_per_minute": null, "tokens_per_minute": 9000})),
        },
        &validate,
    )
    .unwrap();
    let t = registry(op).authenticate(&key.key).unwrap();
    assert_eq!(
        (
            t.config.requests_per_minute,
            t.config.tokens_per_minute,
            t.config.share
        ),
        (None, Some(9000), 2.0)
    );

    // Suspension refuses both kinds of key; resuming restores them.
    op.apply(
        "alice",
        Change::Suspend {
            id: "acme".into(),
            suspended: true,
            reason: Some("unpaid".into()),
        },
        &validate,
    )
    .unwrap();
    assert_eq!(
        registry(op).authenticate(&key.key).unwrap_err(),
        Denied::Suspended {
            tenant: "acme".into()
        }
    );
    op.apply(
        "alice",
        Change::Suspend {
            id: "acme".into(),
            suspended: false,
            reason: None,
        },
        &validate,
    )
    .unwrap();
    assert!(registry(op).authenticate(&key.key).is_ok());
}

/// An admin key; a rotation with a grace period (both keys work until it ends); a revocation.
fn admin_and_rotated_keys(op: &Operator, key: &NewKey) -> NewKey {
    let refuse = |c: Change| op.apply("alice", c, &validate).unwrap_err();
    let admin = op
        .apply(
            "alice",
            Change::AddKey {
                id: "acme".into(),
                kind: KeyKind::Admin,
                label: "ci".into(),
            },
            &validate,
        )
        .unwrap()
        .key
        .unwrap();
    assert_eq!(
        registry(op).authenticate_admin(&admin.key).unwrap().id(),
        "acme"
    );
    assert!(
        registry(op).authenticate(&admin.key).is_err(),
        "an admin key is not an API key"
    );
    let rotated = op
        .apply(
            "alice",
            Change::RotateKey {
                id: "acme".into(),
                key_id: key.key_id.clone(),
                grace_secs: 3600,
                label: None,
            },
            &validate,
        )
        .unwrap()
        .key
        .unwrap();
    let reg = registry(op);
    assert!(reg.authenticate(&key.key).is_ok() && reg.authenticate(&rotated.key).is_ok());
    let snap = op.snapshot().unwrap();
    let ends = snap.next_expiry_ms.unwrap();
    assert!(
        (ends - now_ms() - 3_600_000).abs() < 60_000,
        "the old key ends in an hour"
    );
    op.apply(
        "alice",
        Change::RotateKey {
            id: "acme".into(),
            key_id: rotated.key_id.clone(),
            grace_secs: 0,
            label: Some("v3".into()),
        },
        &validate,
    )
    .unwrap();
    assert_eq!(
        registry(op).authenticate(&rotated.key).unwrap_err(),
        Denied::BadKey
    );
    op.apply(
        "alice",
        Change::RevokeKey {
            id: "acme".into(),
            key_id: key.key_id.clone(),
        },
        &validate,
    )
    .unwrap();
    assert_eq!(
        registry(op).authenticate(&key.key).unwrap_err(),
        Denied::BadKey
    );
    assert!(matches!(
        refuse(Change::RevokeKey {
            id: "acme".into(),
            key_id: key.key_id.clone()
        }),
        OpError::Revoked(_)
    ));
    assert!(matches!(
        refuse(Change::RevokeKey {
            id: "acme".into(),
            key_id: "000000000000".into()
        }),
        OpError::NoKey { .. }
    ));
    admin
}

/// The audit log (who, what, when, newest first; the tenant's own view), then the store
/// reopened as a restart or another replica finds it.
fn audit_and_reopen(op: Operator, url: &str, admin: &NewKey) {
    let audit = op.audit(None, 100).unwrap();
    let actions: Vec<_> = audit.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "key.revoke",
            "key.rotate",
            "key.rotate",
            "key.create",
            "tenant.resume",
            "tenant.suspend",
            "tenant.update",
            "tenant.create",
            "tenant.import"
        ]
    );
    assert!(audit[..8]
        .iter()
        .all(|e| e.actor == "alice" && e.tenant == "acme"));
    assert_eq!(
        (audit[8].actor.as_str(), audit[8].tenant.as_str()),
        ("bootstrap", "boot")
    );
    assert!(audit.iter().all(|e| (now_ms() - e.at_ms).abs() < 60_000));
    assert_eq!(audit[5].detail["reason"], "unpaid");
    assert_eq!(op.audit(Some("boot"), 100).unwrap().len(), 1);
    assert_eq!(op.audit(None, 2).unwrap().len(), 2);

    // Reopened (a restart, or another replica): the same tenants, nothing imported again.
    drop(op);
    let op = Operator::open(config(url)).unwrap();
    assert!(!op.bootstrap(&file_tenants()).unwrap());
    let reg = registry(&op);
    assert_eq!(reg.tenants().len(), 2);
    assert_eq!(reg.authenticate_admin(&admin.key).unwrap().id(), "acme");
    let last = op.revision().unwrap();
    op.apply("alice", Change::Delete { id: "acme".into() }, &validate)
        .unwrap();
    assert_eq!(op.revision().unwrap(), last + 1);
    assert!(registry(&op).authenticate_admin(&admin.key).is_err());
    assert_eq!(op.records().unwrap().len(), 1);
}

#[test]
fn sqlite_store_keeps_tenants_keys_and_audit() {
    let dir = std::env::temp_dir().join(format!("cachet-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("operator.db");
    let _ = std::fs::remove_file(&db);
    exercise(&format!("sqlite:{}", db.display()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn postgres_store_keeps_tenants_keys_and_audit() {
    let Some(pg) = cachet_tests::PgServer::start() else {
        eprintln!("skipped: no PostgreSQL server binaries here (apt install postgresql)");
        return;
    };
    exercise(&pg.url);
}

#[test]
fn config_refusals_say_what_to_give() {
    let mut c = config("sqlite:x.db");
    c.key.clear();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("at least one [[operator.key]]"));
    let mut c = config("sqlite:x.db");
    c.database_env = Some("X".into());
    assert!(c.validate().unwrap_err().to_string().contains("not both"));
    let mut c = config("sqlite:x.db");
    c.poll_ms = Some(5000);
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("poll_ms must be 50 to 1000"));
    let mut c = config("sqlite:x.db");
    c.key[0].sha256 = "abc".into();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("not 64 hex digits"));
    let c = config("mysql://x");
    assert!(Operator::open(c)
        .err()
        .unwrap()
        .to_string()
        .contains("sqlite:PATH or postgres://"));
    let c = config("sqlite:x.db");
    assert_eq!(c.operator_of("op-key"), Some("alice"));
    assert_eq!(c.operator_of("op-keY"), None);
}
