use super::*;
use cachet_backend::grammar::Constraint;

/// Chunks as servers send them: vLLM's integer `stop_reason` (a token id), escaped text,
/// null usage, errors as objects and as bare strings, unknown fields.
#[test]
fn chunks_read_what_servers_send() {
    let c: Chunk = serde_json::from_str(r#"{"id":"x","choices":[{"index":0,"text":"a\"b\n","finish_reason":null,"stop_reason":151645,"logprobs":null}],"usage":null,"extra":{"k":[1,2]}}"#).unwrap();
    let choice = &c.choices.as_ref().unwrap()[0];
    assert_eq!(choice.text.as_deref(), Some("a\"b\n"));
    assert_eq!(choice.finish_reason, None);
    assert_eq!(choice.stop_reason, None, "a token id is no stop string");
    assert!(c.usage.is_none() && c.error.is_none());
    let c: Chunk = serde_json::from_str(r#"{"choices":[{"text":"","finish_reason":"length","stop_reason":"END"}],"usage":{"prompt_tokens":12,"completion_tokens":"3","prompt_tokens_details":{"cached_tokens":8}}}"#).unwrap();
    let choice = &c.choices.as_ref().unwrap()[0];
    assert_eq!(
        (
            choice.finish_reason.as_deref(),
            choice.stop_reason.as_deref()
        ),
        (Some("length"), Some("END"))
    );
    let u = c.usage.unwrap();
    assert_eq!(
        (
            u.prompt_tokens,
            u.completion_tokens,
            u.prompt_tokens_details.unwrap().cached_tokens
        ),
        (12, 0, 8)
    );
    let c: Chunk =
        serde_json::from_str(r#"{"error":{"message":"model overloaded","code":503}}"#).unwrap();
    let Some(ChunkErrorField::Object(e)) = c.error else {
        panic!("an error object")
    };
    assert_eq!(e.message.as_deref(), Some("model overloaded"));
    let c: Chunk = serde_json::from_str(r#"{"error":"boom","choices":null}"#).unwrap();
    assert!(matches!(c.error, Some(ChunkErrorField::Other(_))) && c.choices.is_none());
    assert!(serde_json::from_str::<Chunk>(r#"{"choices":{"text":"x"}}"#).is_err());
    // Every other type where a string, a count or an object is read: absent, skipped whole.
    let c: Chunk = serde_json::from_str(r#"{"choices":[{"text":["a",{"b":[1]}],"finish_reason":{"x":{"y":2}},"stop_reason":-1.5}],"usage":{"prompt_tokens":-3,"completion_tokens":{"n":1},"prompt_tokens_details":[{"cached_tokens":1}]}}"#).unwrap();
    let choice = &c.choices.as_ref().unwrap()[0];
    assert!(
        choice.text.is_none() && choice.finish_reason.is_none() && choice.stop_reason.is_none()
    );
    let u = c.usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (0, 0));
    assert!(u.prompt_tokens_details.is_none());
    let c: Chunk = serde_json::from_str(r#"{"usage":{"prompt_tokens":7.0,"completion_tokens":true,"prompt_tokens_details":{"cached_tokens":"4","other":null}}}"#).unwrap();
    let u = c.usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (0, 0));
    assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, 0);
    // A string with escapes is read (owned), one without is borrowed from the line.
    let line = r#"{"choices":[{"text":"caf\u00e9","finish_reason":"stop"}]}"#;
    let c: Chunk = serde_json::from_str(line).unwrap();
    let choice = &c.choices.as_ref().unwrap()[0];
    assert_eq!(choice.text.as_deref(), Some("café"));
    assert!(matches!(choice.text, Some(Cow::Owned(_))));
    assert!(matches!(choice.finish_reason, Some(Cow::Borrowed("stop"))));
}

fn body(send_salt: bool, er: &EngineRequest) -> serde_json::Value {
    serde_json::from_slice(&completion_body("m", send_salt, er, "Hello \"x\"")).unwrap()
}

#[test]
fn the_completion_body_carries_every_field_a_request_uses_and_no_other() {
    let plain = EngineRequest::new(vec![1, 2], 16);
    assert_eq!(
        body(false, &plain),
        serde_json::json!({"model": "m", "prompt": "Hello \"x\"", "max_tokens": 16,
            "temperature": plain.sampling.temperature, "top_p": plain.sampling.top_p,
            "stream": true, "stream_options": {"include_usage": true}})
    );
    let mut er = EngineRequest::new(vec![1], 8);
    er.salt = [0xab; 32];
    er.sampling.temperature = 0.7;
    er.sampling.seed = Some(7);
    er.sampling.presence_penalty = 0.5;
    er.sampling.frequency_penalty = -0.25;
    er.sampling.logit_bias = vec![(42, -100.0), (7, 2.5)];
    er.sampling.top_k = 20;
    er.sampling.min_p = 0.05;
    er.sampling.repetition_penalty = 1.1;
    er.sampling.min_tokens = 3;
    er.ignore_eos = true;
    er.stop = vec!["END".into()];
    er.stop_token_ids = vec![2, 11];
    er.tag = "user-9".into();
    er.constraint = Some(Constraint::Regex("[0-9]+".into()));
    let b = body(true, &er);
    assert_eq!(
        b["temperature"],
        serde_json::json!(0.7),
        "f32 0.7 sent as 0.7"
    );
    for (k, v) in [
        ("seed", serde_json::json!(7)),
        ("presence_penalty", serde_json::json!(0.5)),
        ("frequency_penalty", serde_json::json!(-0.25)),
        ("logit_bias", serde_json::json!({"42": -100.0, "7": 2.5})),
        ("top_k", serde_json::json!(20)),
        ("min_p", serde_json::json!(0.05)),
        ("repetition_penalty", serde_json::json!(1.1)),
        ("min_tokens", serde_json::json!(3)),
        ("ignore_eos", serde_json::json!(true)),
        ("stop", serde_json::json!(["END"])),
        ("stop_token_ids", serde_json::json!([2, 11])),
        ("user", serde_json::json!("user-9")),
        ("structured_outputs", serde_json::json!({"regex": "[0-9]+"})),
        ("cache_salt", serde_json::json!("ab".repeat(32))),
    ] {
        assert_eq!(b[k], v, "{k}");
    }
    assert!(b.get("response_format").is_none());
    assert!(body(false, &er).get("cache_salt").is_none());
    er.constraint = Some(Constraint::JsonSchema(
        serde_json::json!({"type": "object"}),
    ));
    assert_eq!(
        body(false, &er)["response_format"],
        serde_json::json!({"type": "json_schema",
            "json_schema": {"name": "output", "schema": {"type": "object"}, "strict": true}})
    );
    er.constraint = Some(Constraint::JsonObject);
    assert_eq!(
        body(false, &er)["response_format"],
        serde_json::json!({"type": "json_object"})
    );
    for (c, key, v) in [
        (
            Constraint::Choice(vec!["a".into(), "b".into()]),
            "choice",
            serde_json::json!(["a", "b"]),
        ),
        (
            Constraint::Lark("start: \"x\"".into()),
            "grammar",
            serde_json::json!("start: \"x\""),
        ),
    ] {
        er.constraint = Some(c);
        assert_eq!(body(false, &er)["structured_outputs"][key], v);
    }
}
