//! The usage log against its two stores — an SQLite file and a real PostgreSQL server (Debian's,
//! started here) — through the same checks: records written in batches off the caller's
//! thread, summaries by day and model, spend that survives a reopen; PostgreSQL over TLS as its
//! URL's `sslmode` says.

use cachet_gateway::usage::{day_of, now_ms, Period, Price, Record, Store, UsageLog};

fn record(tenant: &str, model: &str, at_ms: i64, tokens: (u64, u64, u64)) -> Record {
    Record {
        at_ms,
        request_id: format!("chatcmpl-{at_ms}"),
        tenant: tenant.into(),
        key_id: "0123456789ab".into(),
        model: model.into(),
        endpoint: "/v1/chat/completions".into(),
        status: 200,
        prompt_tokens: tokens.0,
        cached_tokens: tokens.1,
        completion_tokens: tokens.2,
        ttft_ms: Some(12.5),
        e2e_ms: 80.0,
        route: Some("embedded".into()),
        cost_usd: 0.0,
    }
}

fn prices() -> Vec<Price> {
    vec![Price {
        model: "smollm2".into(),
        input_per_mtok: 1.0,
        cached_input_per_mtok: Some(0.25),
        output_per_mtok: 4.0,
    }]
}

fn exercise(url: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let now = now_ms();
    let yesterday = now - 86_400_000;
    let (today, before) = (day_of(now), day_of(yesterday));
    let log = UsageLog::open(url, prices()).unwrap();
    // 600 records (more than two batches) over two days, two models, two tenants.
    for i in 0..600u64 {
        let at = if i % 3 == 0 { yesterday } else { now };
        let model = if i % 5 == 0 { "other" } else { "smollm2" };
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        log.record(record(tenant, model, at, (100 + i, 64, 10)));
    }
    assert_eq!(log.dropped(), 0);
    let rows = rt.block_on(log.summary("a", &before, &today)).unwrap();
    // Expected sums, computed here from the same records.
    let mut want = std::collections::BTreeMap::new();
    for i in (0..600u64).filter(|i| i % 2 == 0) {
        let day = if i % 3 == 0 { &before } else { &today };
        let model = if i % 5 == 0 { "other" } else { "smollm2" };
        let e = want
            .entry((day.clone(), model.to_string()))
            .or_insert((0u64, 0u64, 0u64, 0u64, 0f64));
        e.0 += 1;
        e.1 += 100 + i;
        e.2 += 64;
        e.3 += 10;
        if model == "smollm2" {
            e.4 += prices()[0].cost(100 + i, 64, 10);
        }
    }
    assert_eq!(rows.len(), want.len(), "{rows:?}");
    for r in &rows {
        let w = want[&(r.day.clone(), r.model.clone())];
        assert_eq!(
            (
                r.requests,
                r.prompt_tokens,
                r.cached_tokens,
                r.completion_tokens
            ),
            (w.0, w.1, w.2, w.3),
            "{r:?}"
        );
        assert!((r.cost_usd - w.4).abs() < 1e-9, "{r:?} vs {}", w.4);
    }
    let spent_a = log.spent("a", Period::Day);
    let today_cost: f64 = want
        .iter()
        .filter(|((d, _), _)| *d == today)
        .map(|(_, w)| w.4)
        .sum();
    assert!(
        (spent_a - today_cost).abs() < 1e-9,
        "{spent_a} vs {today_cost}"
    );
    // Reopened (a restart): the records are there, and so is today's spend.
    drop(log);
    let log = UsageLog::open(url, prices()).unwrap();
    assert!((log.spent("a", Period::Day) - today_cost).abs() < 1e-9);
    assert!(log.spent("b", Period::Month) > 0.0);
    let again = rt.block_on(log.summary("a", &before, &today)).unwrap();
    assert_eq!(again, rows);
    assert_eq!(Store::open(url).unwrap().count().unwrap(), 600);
}

#[test]
fn sqlite_keeps_records_and_spend_across_a_reopen() {
    let dir = std::env::temp_dir().join(format!("cachet-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("usage.db");
    let _ = std::fs::remove_file(&db);
    exercise(&format!("sqlite:{}", db.display()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn postgres_keeps_records_and_spend_across_a_reopen() {
    let Some(pg) = cachet_tests::PgServer::start() else {
        eprintln!("skipped: no PostgreSQL server binaries here (apt install postgresql)");
        return;
    };
    exercise(&pg.url);
}

/// The schema `main` wrote before the daily rollup: the records alone.
const SCHEMA_WITHOUT_ROLLUP: &str = "CREATE TABLE usage_records (at_ms BIGINT NOT NULL, \
    day TEXT NOT NULL, request_id TEXT NOT NULL, tenant TEXT NOT NULL, key_id TEXT NOT NULL, \
    model TEXT NOT NULL, endpoint TEXT NOT NULL, status INTEGER NOT NULL, \
    prompt_tokens BIGINT NOT NULL, cached_tokens BIGINT NOT NULL, \
    completion_tokens BIGINT NOT NULL, ttft_ms DOUBLE PRECISION, e2e_ms DOUBLE PRECISION NOT NULL, \
    route TEXT, cost_usd DOUBLE PRECISION NOT NULL)";

/// Records as the earlier schema held them: (tenant, day, model) in a small pattern.
fn old_rows(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "({}, '2026-11-{:02}', 'r{i}', '{}', 'k', '{}', '/v1/chat/completions', 200, {}, 4, 7, 1.5, 9.0, 'embedded', {})",
                1_700_000_000_000i64 + i as i64,
                1 + i % 3,
                ["a", "b"][i % 2],
                ["m1", "m2"][(i / 2) % 2],
                10 + i,
                0.001 * i as f64
            )
        })
        .collect()
}

/// A database written by the schema before the rollup opens with its records rolled up once:
/// the summaries are the records' sums, and records written after add to them.
fn upgrades(url: &str, exec: &dyn Fn(&str)) {
    exec(SCHEMA_WITHOUT_ROLLUP);
    exec(&format!(
        "INSERT INTO usage_records VALUES {}",
        old_rows(60).join(", ")
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let log = UsageLog::open(url, prices()).unwrap();
    let rows = rt
        .block_on(log.summary("a", "2026-11-01", "2026-11-03"))
        .unwrap();
    // Tenant a: even i; days by i % 3, models by (i / 2) % 2: six groups of five.
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in &rows {
        let want: Vec<usize> = (0..60)
            .filter(|i| i % 2 == 0)
            .filter(|i| format!("2026-11-{:02}", 1 + i % 3) == r.day)
            .filter(|i| ["m1", "m2"][(i / 2) % 2] == r.model)
            .collect();
        assert_eq!(r.requests, want.len() as u64, "{r:?}");
        assert_eq!(
            r.prompt_tokens,
            want.iter().map(|i| 10 + *i as u64).sum::<u64>()
        );
        assert_eq!(
            (r.cached_tokens, r.completion_tokens),
            (4 * r.requests, 7 * r.requests)
        );
    }
    // Opened again: rolled up once, not twice.
    drop(log);
    let log = UsageLog::open(url, prices()).unwrap();
    assert_eq!(
        rt.block_on(log.summary("a", "2026-11-01", "2026-11-03"))
            .unwrap(),
        rows
    );
}

#[test]
fn sqlite_written_before_the_rollup_is_rolled_up_once() {
    let dir = std::env::temp_dir().join(format!("cachet-usage-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("usage.db");
    let _ = std::fs::remove_file(&db);
    let c = rusqlite::Connection::open(&db).unwrap();
    upgrades(&format!("sqlite:{}", db.display()), &|q| {
        c.execute_batch(q).unwrap()
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn postgres_written_before_the_rollup_is_rolled_up_once() {
    let Some(pg) = cachet_tests::PgServer::start() else {
        eprintln!("skipped: no PostgreSQL server binaries here (apt install postgresql)");
        return;
    };
    let c = std::sync::Mutex::new(postgres::Client::connect(&pg.url, postgres::NoTls).unwrap());
    upgrades(&pg.url, &|q| c.lock().unwrap().batch_execute(q).unwrap());
}

#[test]
fn bad_store_urls_say_what_to_give() {
    for (url, want) in [
        ("mysql://x", "sqlite:PATH or postgres://"),
        ("sqlite:", "needs a file path"),
        ("sqlite:/nonexistent-dir/x/usage.db", "opening"),
    ] {
        let e = UsageLog::open(url, vec![]).unwrap_err().to_string();
        assert!(e.contains(want), "{url}: {e}");
    }
}

/// A CA, a server certificate for `localhost` only (not for 127.0.0.1) and a client certificate
/// for the user `cachet_cert`, in `dir`: (the server's TLS, the CA file, the client cert, its key).
fn pg_certs(dir: &std::path::Path) -> (cachet_tests::PgTls, String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "cachet test PostgreSQL CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cachet_cert");
    let client = client.signed_by(&client_key, &issuer).unwrap();
    let path = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let tls = cachet_tests::PgTls {
        cert_pem: server.pem(),
        key_pem: key.serialize_pem(),
        client_ca_pem: ca_cert.pem(),
        cert_user: "cachet_cert".into(),
    };
    (
        tls,
        path("ca.pem", ca_cert.pem()),
        path("client.pem", client.pem()),
        path("client.key", client_key.serialize_pem()),
    )
}

/// PostgreSQL over TLS as libpq reads the URL, against a real server that takes TLS only: each
/// `sslmode` checks what it says (the chain, the host name, nothing), a client certificate logs
/// in where the server asks for one, and the usage store runs over `verify-full`.
#[test]
fn postgres_over_tls_honours_sslmode_and_its_certificates() {
    use cachet_gateway::db::Conn;
    let dir = std::env::temp_dir().join(format!("cachet-pg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (tls, ca, client_cert, client_key) = pg_certs(&dir);
    let Some(pg) = cachet_tests::PgServer::start_tls(&tls) else {
        eprintln!("skipped: no PostgreSQL server binaries here (apt install postgresql)");
        return;
    };
    let port = pg
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let url = |user: &str, host: &str, query: &str| {
        format!("postgres://{user}@{host}:{port}/postgres?{query}")
    };
    // The session's TLS version as the server sees it ("off" for a plain one).
    let tls_of = |u: &str| -> Result<String, String> {
        let mut c = Conn::open(u).map_err(|e| e.to_string())?;
        let rows = c
            .query(
                "SELECT CASE WHEN ssl THEN version ELSE 'off' END FROM pg_stat_ssl \
                 WHERE pid = pg_backend_pid()",
                &[],
            )
            .map_err(|e| e.to_string())?;
        Ok(rows[0][0].text().to_string())
    };
    let root = format!("sslrootcert={ca}");
    let ok = |u: String| {
        let v = tls_of(&u).unwrap_or_else(|e| panic!("{u}: {e}"));
        assert!(v.starts_with("TLSv1."), "{u}: {v}");
    };
    let refused = |u: String, want: &str| {
        let e = tls_of(&u).expect_err(&u);
        assert!(e.to_lowercase().contains(want), "{u}: {e}");
    };
    ok(url(
        "cachet",
        "localhost",
        &format!("sslmode=verify-full&{root}"),
    ));
    // The certificate names localhost, not 127.0.0.1: verify-full refuses, verify-ca (the chain
    // only) takes it.
    refused(
        url(
            "cachet",
            "127.0.0.1",
            &format!("sslmode=verify-full&{root}"),
        ),
        "not valid for name",
    );
    ok(url(
        "cachet",
        "127.0.0.1",
        &format!("sslmode=verify-ca&{root}"),
    ));
    // Without the CA the chain does not verify; require and prefer (the default) only encrypt.
    refused(url("cachet", "localhost", "sslmode=verify-full"), "issuer");
    refused(url("cachet", "localhost", "sslmode=verify-ca"), "issuer");
    ok(url("cachet", "127.0.0.1", "sslmode=require"));
    ok(url("cachet", "127.0.0.1", ""));
    // disable sends no TLS: this server refuses plain connections.
    refused(
        url("cachet", "127.0.0.1", "sslmode=disable"),
        "no encryption",
    );
    // A user that logs in by certificate: with sslcert/sslkey, and not without.
    Conn::open(&url(
        "cachet",
        "localhost",
        &format!("sslmode=verify-full&{root}"),
    ))
    .unwrap()
    .transaction(|tx| tx.batch("CREATE ROLE cachet_cert LOGIN"))
    .unwrap();
    let cert = format!("sslmode=verify-full&{root}&sslcert={client_cert}&sslkey={client_key}");
    ok(url("cachet_cert", "localhost", &cert));
    refused(
        url(
            "cachet_cert",
            "localhost",
            &format!("sslmode=verify-full&{root}"),
        ),
        "certificate",
    );
    // The usage store over verify-full, as a deployment would run it.
    exercise(&url(
        "cachet",
        "localhost",
        &format!("sslmode=verify-full&{root}"),
    ));
    drop(pg);
    let _ = std::fs::remove_dir_all(&dir);
}
