use super::*;

fn common(cache_salt: Option<&str>) -> Common {
    let mut v = serde_json::json!({"model": "m"});
    if let Some(c) = cache_salt {
        v["cache_salt"] = c.into();
    }
    serde_json::from_value(v).unwrap()
}

fn parse(body: &str) -> Result<Parsed, ApiError> {
    parse_request(true, body.as_bytes(), UnknownFields::Reject)
}

/// What the body's members say reaches the typed request, and what is wrong with one is a
/// 400 that names it: the member scan's errors, the typing's, the message reader's.
#[test]
fn bodies_are_typed_from_their_members_and_errors_name_the_member() {
    let p = parse(r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"temperature":0.5,"max_tokens":7,"stop":["x"],"n":1}"#).unwrap();
    let Input::Chat(r, msgs) = &p.input else {
        panic!("a chat")
    };
    assert_eq!(r.common.model, "m");
    assert_eq!((r.common.temperature, p.max_tokens), (Some(0.5), Some(7)));
    assert_eq!(p.stop, ["x"]);
    assert_eq!(
        msgs.iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect::<Vec<_>>(),
        [("system", "be brief"), ("user", "hi")]
    );
    let err = |body: &str| parse(body).err().expect("a 400");
    let e = err(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":"hot"}"#);
    assert_eq!(e.status, hyper::StatusCode::BAD_REQUEST);
    assert_eq!(e.param.as_deref(), Some("temperature"));
    assert!(
        e.message.contains("`temperature`") && e.message.contains("expected f32"),
        "{}",
        e.message
    );
    assert!(
        !e.message.contains("line"),
        "no position inside one value: {}",
        e.message
    );
    let e = err(r#"{"model":"m","model":"n","messages":[{"role":"user","content":"hi"}]}"#);
    assert_eq!(e.param.as_deref(), Some("model"));
    assert!(e.message.contains("`model` appears twice"), "{}", e.message);
    // Past the pairwise checks' size, through the set: the same answer.
    let many: String = (0..40).map(|i| format!("\"x{i}\":1,")).collect();
    let e = Members::parse(format!("{{{many}\"x7\":2}}").as_bytes())
        .err()
        .unwrap();
    assert_eq!(e.param.as_deref(), Some("x7"));
    let e = err(r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    assert!(e.message.contains("missing field `model`"), "{}", e.message);
    let e = err(r#"{"model":"m","messages":[{"role":"user"}]}"#);
    assert!(
        e.message.contains("missing field `content`"),
        "{}",
        e.message
    );
    assert_eq!(e.param.as_deref(), Some("messages"));
    let e = err(r#"{"model":"m","messages":[{"role":"user","role":"system","content":"x"}]}"#);
    assert!(
        e.message.contains("duplicate field `role`"),
        "{}",
        e.message
    );
    let e = err(r#"[1, 2]"#);
    assert_eq!(e.message, "the body must be a JSON object");
    let e = err(r#"{"model":"m","messages":[}"#);
    assert!(e.message.starts_with("invalid JSON body:"), "{}", e.message);
    let e = err(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]} trailing"#);
    assert!(e.message.starts_with("invalid JSON body:"), "{}", e.message);
    // A refused field's value decides (its no-op passes), an unknown field is named.
    assert!(
        parse(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"functions":[]}"#)
            .is_ok()
    );
    let e = err(
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"functions":[{"name":"f"}]}"#,
    );
    assert_eq!(e.param.as_deref(), Some("functions"));
    let e = err(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temprature":1}"#);
    assert_eq!(e.param.as_deref(), Some("temprature"));
    // A number out of range is an error where it is read, never a panic.
    let e = err(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"functions":1e400}"#);
    assert_eq!(e.param.as_deref(), Some("functions"));
    let e = err(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1e400}"#);
    assert_eq!(e.param.as_deref(), Some("temperature"));
}

#[test]
fn a_client_cache_salt_splits_its_tenant_and_never_joins_another() {
    let (a, b) = ([1u8; 32], [2u8; 32]);
    assert_eq!(common(None).salt(&a), a);
    let x = common(Some("user-7"));
    assert_ne!(x.salt(&a), a, "the client's salt splits the tenant's cache");
    assert_eq!(x.salt(&a), common(Some("user-7")).salt(&a));
    assert_ne!(x.salt(&a), common(Some("user-8")).salt(&a));
    assert_ne!(
        x.salt(&a),
        x.salt(&b),
        "the same client salt in two tenants stays apart"
    );
    assert!(common(Some("")).validate().is_err());
    assert!(common(Some(&"x".repeat(300))).validate().is_err());
}
