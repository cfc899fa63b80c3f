//! Tenant templates in the sandbox: the example templates built with the project's script render
//! the expected prompts; hostile guests (written in WAT here) each get the right error within the
//! deadline while good calls keep succeeding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cachet_gateway::sandbox::{Budget, Sandbox, SandboxConfig, TemplateError};
use cachet_guest_sdk::{Cache, Message, Request, Segment, Tenant};

/// An example template's module bytes, built with the project's script.
fn build_example(name: &str) -> Vec<u8> {
    std::fs::read(cachet_tests::build_template(name)).unwrap()
}

fn sandbox() -> Arc<Sandbox> {
    Sandbox::new(SandboxConfig::default()).unwrap()
}

fn request(question: &str) -> Request {
    Request {
        model: "smollm2".into(),
        messages: vec![Message::new("user", question)],
        variables: Default::default(),
        tenant: Tenant {
            id: "acme".into(),
            metadata: Default::default(),
        },
        user: Some("user-42".into()),
        now: "2026-11-29T12:00:00Z".into(),
    }
}

#[test]
fn the_example_templates_build_and_render_the_expected_prompts() {
    let sb = sandbox();
    let budget = sb.budget(None, None, None);
    // Support bot: persona + two few-shot pairs, static; the question, dynamic.
    let m = sb.compile(&build_example("support-bot")).unwrap();
    let (r, stats) = sb
        .render(&m, &request("Why is my light red?"), &budget, "t".into())
        .unwrap();
    assert_eq!(r.segments.len(), 6);
    assert!(r.segments[0]
        .text
        .starts_with("You are Ada, the support assistant"));
    assert_eq!(
        r.segments.iter().map(|s| s.cache).collect::<Vec<_>>(),
        [
            Cache::Static,
            Cache::Static,
            Cache::Static,
            Cache::Static,
            Cache::Static,
            Cache::Dynamic
        ]
    );
    assert_eq!(
        r.segments
            .iter()
            .map(|s| s.role.as_str())
            .collect::<Vec<_>>(),
        ["system", "user", "assistant", "user", "assistant", "user"]
    );
    assert_eq!(
        r.segments[5],
        Segment::varying("user", "Why is my light red?")
    );
    assert_eq!(r.max_tokens, Some(256));
    assert!(stats.fuel_used > 0);
    // The same static prefix for another question.
    let (r2, _) = sb
        .render(&m, &request("Another question"), &budget, "t".into())
        .unwrap();
    assert_eq!(r.segments[..5], r2.segments[..5]);

    // RAG: numbered documents from the `documents` variable.
    let m = sb.compile(&build_example("rag")).unwrap();
    let mut req = request("Who wrote it?");
    req.variables.insert(
        "documents".into(),
        r#"[{"title": "Dune", "text": "Dune is a 1965 novel by Frank Herbert."}, {"title": "Foundation", "text": " Written by Isaac Asimov. "}]"#.into(),
    );
    let (r, _) = sb.render(&m, &req, &budget, "t".into()).unwrap();
    assert_eq!(r.segments[0].cache, Cache::Static);
    assert_eq!(
        r.segments[1].text,
        "Documents:\n\n[1] Dune\nDune is a 1965 novel by Frank Herbert.\n\n[2] Foundation\nWritten by Isaac Asimov.\n\n"
    );
    assert_eq!(r.segments[2].text, "Question: Who wrote it?");
    // A malformed variable is the template's refusal, with its message.
    req.variables.insert("documents".into(), "not json".into());
    match sb.render(&m, &req, &budget, "t".into()) {
        Err(TemplateError::Refused(msg)) => assert!(msg.contains("JSON array"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // Clock + user id at the very start of the "static" system prompt.
    let m = sb.compile(&build_example("clock-user")).unwrap();
    let (r, _) = sb
        .render(&m, &request("Balance?"), &budget, "t".into())
        .unwrap();
    assert!(
        r.segments[0]
            .text
            .starts_with("Current time: 2026-11-29T12:00:00Z. User id: user-42.\nYou are the assistant of Contoso Bank."),
        "{}",
        r.segments[0].text
    );
    assert_eq!(r.segments[0].cache, Cache::Static);
}

/// A module with the ABI's exports; `render` is the body of `cachet_render` (params: ptr, len;
/// result: i64), `extra` more module fields.
fn guest(render: &str, extra: &str) -> Vec<u8> {
    guest_with_pages(1, render, extra)
}

/// As `guest`, with `pages` of memory; the request is written into the last page (offset 8192
/// when there is only one), so data placed before it survives the call.
fn guest_with_pages(pages: usize, render: &str, extra: &str) -> Vec<u8> {
    let input_at = if pages == 1 {
        8192
    } else {
        (pages - 1) * 65536
    };
    wat::parse_str(format!(
        r#"(module
            {extra}
            (memory (export "memory") {pages})
            (func (export "cachet_abi_version") (result i32) i32.const 1)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const {input_at})
            (func (export "cachet_render") (param i32 i32) (result i64) {render}))"#
    ))
    .unwrap()
}

/// A guest whose reply is `reply`, stored at offset 1024.
fn replying(reply: &[u8]) -> Vec<u8> {
    let escaped: String = reply.iter().map(|b| format!("\\{b:02x}")).collect();
    guest_with_pages(
        (1024 + reply.len()) / 65536 + 2,
        &format!("i64.const {}", (1024u64 << 32) | reply.len() as u64),
        &format!(r#"(data (i32.const 1024) "{escaped}")"#),
    )
}

const GOOD_REPLY: &[u8] = br#"{"segments":[{"role":"user","text":"hello","cache":"dynamic"}]}"#;

fn expect_err(sb: &Sandbox, bytes: &[u8], budget: &Budget) -> (TemplateError, Duration) {
    let m = sb.compile(bytes).expect("the module validates");
    let t0 = Instant::now();
    let e = sb
        .render(&m, &request("hi"), budget, "hostile".into())
        .expect_err("the call must fail");
    (e, t0.elapsed())
}

#[test]
fn hostile_guests_get_the_right_error_within_the_deadline() {
    let sb = sandbox();
    let budget = sb.budget(None, None, None);
    let deadline = budget.deadline;
    // Infinite loop: the epoch deadline stops it.
    let (e, took) = expect_err(&sb, &guest("(loop br 0) i64.const 0", ""), &budget);
    assert_eq!(e, TemplateError::Timeout(deadline));
    assert!(took < deadline * 4, "stopped after {took:?}");
    // The same loop with a small fuel budget and a long deadline: out of fuel.
    let tight = Budget {
        deadline: Duration::from_secs(5),
        fuel: 1_000_000,
        memory_bytes: budget.memory_bytes,
    };
    let (e, took) = expect_err(&sb, &guest("(loop br 0) i64.const 0", ""), &tight);
    assert_eq!(e, TemplateError::OutOfFuel(1_000_000));
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Memory bomb: grow until refused.
    let bomb = "(loop (drop (memory.grow (i32.const 16))) br 0) i64.const 0";
    let (e, took) = expect_err(&sb, &guest(bomb, ""), &budget);
    assert_eq!(
        e,
        TemplateError::OutOfMemory {
            limit: budget.memory_bytes
        }
    );
    assert!(took < deadline * 4, "{took:?}");
    // A declared giant reply, and a real one over the cap.
    let (e, _) = expect_err(&sb, &guest("i64.const 0x7fffffff", ""), &budget);
    assert!(
        matches!(
            e,
            TemplateError::OutputTooLarge {
                size: 0x7fff_ffff,
                ..
            }
        ),
        "{e:?}"
    );
    let big = "(drop (memory.grow (i32.const 40))) i64.const 0x200000";
    let (e, _) = expect_err(&sb, &guest(big, ""), &budget);
    assert!(matches!(e, TemplateError::OutputTooLarge { .. }), "{e:?}");
    // A reply that points outside memory.
    let (e, _) = expect_err(&sb, &guest("i64.const 0x0000fff000000100", ""), &budget);
    assert!(matches!(e, TemplateError::BadOutput(_)), "{e:?}");
    // Trap.
    let (e, _) = expect_err(&sb, &guest("unreachable", ""), &budget);
    assert!(
        matches!(e, TemplateError::Trap(ref m) if m.contains("unreachable")),
        "{e:?}"
    );
    // Not JSON, not UTF-8, JSON of the wrong shape, no segments.
    for (reply, what) in [
        (&b"this is not json"[..], "not JSON"),
        (&b"\xff\xfe{}"[..], "not UTF-8"),
        (&br#"{"segments": "nope"}"#[..], "does not match"),
        (&br#"{"segments": []}"#[..], "no segments"),
    ] {
        let (e, _) = expect_err(&sb, &replying(reply), &budget);
        assert!(
            matches!(&e, TemplateError::BadOutput(m) if m.contains(what)),
            "{what}: {e:?}"
        );
    }
    // Every one of these answers 422 with its own code.
    assert_eq!(TemplateError::Timeout(deadline).status(), 422);
    assert_eq!(TemplateError::Timeout(deadline).code(), "template_timeout");
}

#[test]
fn bad_modules_are_refused_at_upload() {
    let sb = sandbox();
    assert!(matches!(
        sb.compile(b"hello, this is not wasm"),
        Err(TemplateError::NotWasm(_))
    ));
    // The text format is refused too: upload the binary.
    assert!(matches!(
        sb.compile(b"(module)"),
        Err(TemplateError::NotWasm(_))
    ));
    // Truncated binary.
    let good = replying(GOOD_REPLY);
    assert!(matches!(
        sb.compile(&good[..good.len() / 2]),
        Err(TemplateError::NotWasm(_))
    ));
    // Missing export.
    let no_render = wat::parse_str(
        r#"(module (memory (export "memory") 1)
            (func (export "cachet_abi_version") (result i32) i32.const 1)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const 0))"#,
    )
    .unwrap();
    match sb.compile(&no_render) {
        Err(TemplateError::MissingExport { what }) => assert!(what.contains("cachet_render")),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // Wrong type of an export.
    let wrong_type = wat::parse_str(
        r#"(module (memory (export "memory") 1)
            (func (export "cachet_abi_version") (result i32) i32.const 1)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const 0)
            (func (export "cachet_render") (param i32 i32) (result i32) i32.const 0))"#,
    )
    .unwrap();
    assert!(matches!(
        sb.compile(&wrong_type),
        Err(TemplateError::MissingExport { .. })
    ));
    // Forbidden import (WASI), and a wrongly typed log import.
    let wasi = guest(
        "i64.const 0",
        r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#,
    );
    assert_eq!(
        sb.compile(&wasi).err(),
        Some(TemplateError::ForbiddenImport {
            module: "wasi_snapshot_preview1".into(),
            name: "fd_write".into()
        })
    );
    let bad_log = guest(
        "i64.const 0",
        r#"(import "cachet" "log" (func (param i64)))"#,
    );
    assert!(matches!(
        sb.compile(&bad_log),
        Err(TemplateError::ForbiddenImport { .. })
    ));
    let ok_log = guest(
        "i64.const 0",
        r#"(import "cachet" "log" (func (param i32 i32)))"#,
    );
    assert!(sb.compile(&ok_log).is_ok());
    // Another ABI version.
    let v2 = wat::parse_str(
        r#"(module (memory (export "memory") 1)
            (func (export "cachet_abi_version") (result i32) i32.const 2)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const 0)
            (func (export "cachet_render") (param i32 i32) (result i64) i64.const 0))"#,
    )
    .unwrap();
    assert_eq!(
        sb.compile(&v2).err(),
        Some(TemplateError::AbiVersion {
            found: 2,
            expected: 1
        })
    );
    // Over the size cap.
    let small = Sandbox::new(SandboxConfig {
        module_bytes: 64,
        ..Default::default()
    })
    .unwrap();
    assert!(matches!(
        small.compile(&good),
        Err(TemplateError::ModuleTooLarge { .. })
    ));
    // A module whose start-up loops (in the ABI version call) is stopped too.
    let looping_version = wat::parse_str(
        r#"(module (memory (export "memory") 1)
            (func (export "cachet_abi_version") (result i32) (loop br 0) i32.const 1)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const 0)
            (func (export "cachet_render") (param i32 i32) (result i64) i64.const 0))"#,
    )
    .unwrap();
    assert!(matches!(
        sb.compile(&looping_version),
        Err(TemplateError::Timeout(_))
    ));
}

#[test]
fn good_calls_succeed_while_hostile_ones_run_and_no_state_leaks() {
    let sb = sandbox();
    let budget = sb.budget(None, None, None);
    let good = sb.compile(&replying(GOOD_REPLY)).unwrap();
    let looping = sb.compile(&guest("(loop br 0) i64.const 0", "")).unwrap();
    let bomb = sb
        .compile(&guest(
            "(loop (drop (memory.grow (i32.const 16))) br 0) i64.const 0",
            "",
        ))
        .unwrap();
    // A guest with state: a global counter it bumps, whose value sets its reply's length. On a
    // fresh instance the counter is 1 and the reply is exactly GOOD_REPLY; on a reused one the
    // reply would take in the `X` after it and stop being JSON.
    let counter = sb
        .compile(&guest(
            &format!(
                "(global.set $n (i32.add (global.get $n) (i32.const 1))) \
                 (i64.or (i64.const 0x40000000000) (i64.extend_i32_u (i32.add (global.get $n) (i32.const {}))))",
                GOOD_REPLY.len() - 1
            ),
            &format!(
                r#"(global $n (mut i32) (i32.const 0)) (data (i32.const 1024) "{}X")"#,
                std::str::from_utf8(GOOD_REPLY).unwrap().replace('"', "\\\"")
            ),
        ))
        .unwrap();
    std::thread::scope(|s| {
        let mut hostile = Vec::new();
        for i in 0..4 {
            let (sb, m) = (&sb, if i % 2 == 0 { &looping } else { &bomb });
            hostile.push(s.spawn(move || {
                sb.render(m, &request("x"), &budget, "hostile".into())
                    .unwrap_err()
            }));
        }
        let t0 = Instant::now();
        let mut ok = 0;
        while t0.elapsed() < Duration::from_millis(150) {
            let (r, _) = sb
                .render(&good, &request("hi"), &budget, "good".into())
                .unwrap();
            assert_eq!(r.segments[0].text, "hello");
            let (r, _) = sb
                .render(&counter, &request("hi"), &budget, "counter".into())
                .unwrap();
            assert_eq!(r.segments[0].text, "hello");
            ok += 1;
        }
        assert!(ok > 10, "only {ok} good calls in 150 ms");
        for h in hostile {
            let e = h.join().unwrap();
            assert!(
                matches!(
                    e,
                    TemplateError::Timeout(_) | TemplateError::OutOfMemory { .. }
                ),
                "{e:?}"
            );
        }
    });
}

#[test]
fn a_tenants_budgets_only_tighten_the_sandbox_and_apply() {
    let sb = sandbox();
    let wide = sb.budget(
        Some(Duration::from_secs(60)),
        Some(u64::MAX),
        Some(usize::MAX),
    );
    let c = SandboxConfig::default();
    assert_eq!(
        (wide.deadline, wide.fuel, wide.memory_bytes),
        (c.deadline, c.fuel, c.memory_bytes)
    );
    let tight = sb.budget(Some(Duration::from_millis(5)), Some(1_000), Some(1 << 20));
    assert_eq!(
        (tight.deadline, tight.fuel, tight.memory_bytes),
        (Duration::from_millis(5), 1_000, 1 << 20)
    );
    // A template that needs 2 MiB fits the sandbox but not a 1 MiB tenant.
    let grow = sb
        .compile(&replying_after(
            GOOD_REPLY,
            "(drop (memory.grow (i32.const 32)))",
        ))
        .unwrap();
    assert!(sb
        .render(
            &grow,
            &request("hi"),
            &sb.budget(None, None, None),
            "t".into()
        )
        .is_ok());
    let small = sb.budget(None, None, Some(1 << 20));
    assert_eq!(
        sb.render(&grow, &request("hi"), &small, "t".into()).err(),
        Some(TemplateError::OutOfMemory { limit: 1 << 20 })
    );
    // And a 5 ms tenant deadline stops a loop in about 5 ms, not the sandbox's 50.
    let looping = sb.compile(&guest("(loop br 0) i64.const 0", "")).unwrap();
    let fast = sb.budget(Some(Duration::from_millis(5)), None, None);
    let t0 = Instant::now();
    assert_eq!(
        sb.render(&looping, &request("hi"), &fast, "t".into()).err(),
        Some(TemplateError::Timeout(Duration::from_millis(5)))
    );
    assert!(
        t0.elapsed() < Duration::from_millis(40),
        "{:?}",
        t0.elapsed()
    );
}

/// Like `replying`, running `before` first (e.g. to use memory).
fn replying_after(reply: &[u8], before: &str) -> Vec<u8> {
    let escaped: String = reply.iter().map(|b| format!("\\{b:02x}")).collect();
    guest(
        &format!(
            "{before} i64.const {}",
            (1024u64 << 32) | reply.len() as u64
        ),
        &format!(r#"(data (i32.const 1024) "{escaped}")"#),
    )
}

#[test]
fn the_log_import_writes_and_bad_pointers_are_harmless() {
    let sb = sandbox();
    let budget = sb.budget(None, None, None);
    // Logs a line from its data, then one from far outside its memory, then 40 more (the host
    // keeps 16 per call), then replies.
    let module = wat::parse_str(format!(
        r#"(module
            (import "cachet" "log" (func $log (param i32 i32)))
            (memory (export "memory") 1)
            (data (i32.const 1024) "{}")
            (data (i32.const 2048) "hello")
            (func (export "cachet_abi_version") (result i32) i32.const 1)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const 8192)
            (func (export "cachet_render") (param i32 i32) (result i64)
                (call $log (i32.const 2048) (i32.const 5))
                (call $log (i32.const 0x7ffffff0) (i32.const 100))
                (local.set 0 (i32.const 40))
                (loop (call $log (i32.const 2048) (i32.const 5))
                      (local.set 0 (i32.sub (local.get 0) (i32.const 1)))
                      (br_if 0 (local.get 0)))
                i64.const {}))"#,
        std::str::from_utf8(GOOD_REPLY)
            .unwrap()
            .replace('"', "\\\""),
        (1024u64 << 32) | GOOD_REPLY.len() as u64
    ))
    .unwrap();
    let m = sb.compile(&module).unwrap();
    let (r, _) = sb
        .render(&m, &request("hi"), &budget, "logger".into())
        .unwrap();
    assert_eq!(r.segments[0].text, "hello");
}

/// A module of `n` empty functions (besides the ABI's), encoded directly: what a compile-time
/// bomb looks like (400k of them took 46 s of gateway CPU to compile before it was parsed first).
fn many_functions(n: u32) -> Vec<u8> {
    // Grow the function and code sections to `n` entries by hand: one type (() -> ()), empty
    // bodies. Rebuilding the module with the wasm encoder would pull in a crate for one test.
    let mut body = Vec::new();
    for _ in 0..n {
        body.extend_from_slice(&[0x02, 0x00, 0x0b]); // size 2: no locals, `end`
    }
    let leb = |mut v: u32| {
        let mut out = Vec::new();
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    };
    // A minimal module of its own: type section, function section, memory + exports, code.
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    let section = |m: &mut Vec<u8>, id: u8, payload: Vec<u8>| {
        m.push(id);
        m.extend(leb(payload.len() as u32));
        m.extend(payload);
    };
    section(&mut m, 1, vec![1, 0x60, 0, 0]);
    let mut funcs = leb(n);
    funcs.extend(std::iter::repeat_n(0u8, n as usize));
    section(&mut m, 3, funcs);
    section(&mut m, 5, vec![1, 0, 1]);
    let mut exp = vec![1];
    exp.extend(leb(6));
    exp.extend_from_slice(b"memory");
    exp.extend_from_slice(&[2, 0]);
    section(&mut m, 7, exp);
    let mut code = leb(n);
    code.extend(body);
    section(&mut m, 10, code);
    m
}

#[test]
fn modules_built_to_be_slow_to_compile_are_refused_by_parsing_first() {
    let sb = sandbox();
    // 400k functions in ~1.2 MB: refused in milliseconds, without compiling.
    let bomb = many_functions(400_000);
    assert!(bomb.len() < 4 << 20, "{}", bomb.len());
    let t0 = Instant::now();
    match sb.compile(&bomb) {
        Err(TemplateError::TooComplex { what, found, limit }) => {
            assert_eq!((what, found, limit), ("functions", 400_000, 10_000));
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    // A module without `cachet_render` is refused by parsing too, before compiling.
    let t0 = Instant::now();
    let no_render = many_functions(10);
    assert!(matches!(
        sb.compile(&no_render),
        Err(TemplateError::MissingExport { .. })
    ));
    assert!(t0.elapsed() < Duration::from_millis(200));
    // Just under the limit, a real template compiles (on one core) well inside the deadline.
    let funcs = "(func)\n".repeat(9_000);
    let t0 = Instant::now();
    sb.compile(&guest("i64.const 0", &funcs)).unwrap();
    let took = t0.elapsed();
    println!("9,000 functions compiled in {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn replies_with_more_stop_strings_than_the_api_allows_are_refused() {
    let sb = sandbox();
    let budget = sb.budget(None, None, None);
    let stops: Vec<String> = (0..90_000).map(|i| format!("s{i}")).collect();
    let reply = serde_json::json!({"segments": [{"role": "user", "text": "hi", "cache": "dynamic"}], "stop": stops});
    let (e, took) = expect_err(&sb, &replying(reply.to_string().as_bytes()), &budget);
    assert!(
        matches!(e, TemplateError::BadOutput(ref m) if m.contains("at most 4")),
        "{e}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    let reply = br#"{"segments":[{"role":"user","text":"hi","cache":"dynamic"}],"stop":["a","b"],"max_tokens":0}"#;
    let (e, _) = expect_err(&sb, &replying(reply), &budget);
    assert!(
        matches!(e, TemplateError::BadOutput(ref m) if m.contains("max_tokens")),
        "{e}"
    );
}

#[test]
fn the_compiled_module_cache_is_bounded_and_deleted_templates_release_their_code() {
    use cachet_gateway::sandbox::store::{Quota, TemplateStore};
    let sb = Sandbox::new(SandboxConfig::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("cachet-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = TemplateStore::open(&dir, sb.clone())
        .unwrap()
        .with_quota(Quota {
            versions: 3,
            bytes: 1 << 20,
        });
    let a = replying(GOOD_REPLY);
    let b = replying(br#"{"segments":[{"role":"user","text":"other","cache":"dynamic"}]}"#);
    store.upload("t", "one", &a).unwrap();
    let (bytes_one, n) = sb.cache_usage();
    assert_eq!(n, 1);
    assert!(bytes_one > 0);
    // A second version is stored but not active: its code is not kept.
    store.upload("t", "one", &b).unwrap();
    assert_eq!(sb.cache_usage().1, 1);
    // Activating it swaps which code is kept; the old one is released.
    store.activate("t", "one", 2).unwrap();
    store.resolve("t", "one").unwrap();
    assert_eq!(sb.cache_usage().1, 1);
    assert!(sb.cached(blake3::hash(&a).as_bytes()).is_none());
    // Quota: three versions per tenant.
    store.upload("t", "two", &a).unwrap();
    match store.upload("t", "two", &b) {
        Err(TemplateError::QuotaExceeded(m)) => assert!(m.contains("delete versions"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // Deleting a template releases its code at once.
    store.delete("t", "one", None).unwrap();
    store.delete("t", "two", None).unwrap();
    assert_eq!(sb.cache_usage(), (0, 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn replicas_sharing_a_templates_directory_never_serve_a_stale_active_version() {
    use cachet_gateway::sandbox::store::TemplateStore;
    let sb = sandbox();
    let dir = std::env::temp_dir().join(format!("cachet-shared-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Two replicas' stores over one directory (a shared volume), each with its own index.
    let a = TemplateStore::open(&dir, sb.clone()).unwrap();
    let b = TemplateStore::open(&dir, sb.clone()).unwrap();
    let (one, two, three) = (replying(b"one"), replying(b"two"), replying(b"three"));
    let hash = |bytes: &[u8]| blake3::hash(bytes).as_bytes().to_owned();
    // Uploaded on A: B serves it at once (its index had never seen the template).
    a.upload("t", "shared", &one).unwrap();
    assert_eq!(b.resolve("t", "shared").unwrap().hash, hash(&one));
    // B uploads the next version (numbered after A's), A activates it: B serves it the moment
    // the activation has returned, and A too.
    let (v2, active) = b.upload("t", "shared", &two).unwrap();
    assert_eq!((v2.version, active), (2, false));
    a.activate("t", "shared", 2).unwrap();
    assert_eq!(b.resolve("t", "shared").unwrap().hash, hash(&two));
    assert_eq!(a.resolve("t", "shared").unwrap().hash, hash(&two));
    // Back to 1 from B: A follows.
    b.activate("t", "shared", 1).unwrap();
    assert_eq!(a.resolve("t", "shared").unwrap().hash, hash(&one));
    // Listings show what the directory holds, whichever replica wrote it.
    a.upload("t", "shared", &three).unwrap();
    let listed = b.list("t");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0]
            .versions
            .iter()
            .map(|v| v.version)
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(listed[0].active, Some(1));
    // Uploads racing from both replicas get distinct version numbers.
    std::thread::scope(|s| {
        let ha = s.spawn(|| a.upload("t", "race", &one).unwrap().0.version);
        let hb = s.spawn(|| b.upload("t", "race", &two).unwrap().0.version);
        let (va, vb) = (ha.join().unwrap(), hb.join().unwrap());
        assert_ne!(va, vb);
    });
    assert_eq!(
        a.list("t")
            .iter()
            .find(|t| t.name == "race")
            .unwrap()
            .versions
            .len(),
        2
    );
    // Deleted on A: B no longer serves it.
    a.delete("t", "shared", None).unwrap();
    assert!(matches!(
        b.resolve("t", "shared"),
        Err(TemplateError::NotFound(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}
