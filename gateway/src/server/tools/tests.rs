use super::*;

fn run(format: Format, limit: usize, pieces: &[&str]) -> Vec<Out> {
    let mut p = Parser::new(format, limit);
    let mut out: Vec<Out> = pieces.iter().flat_map(|s| p.feed(s)).collect();
    out.extend(p.finish());
    // Adjacent text pieces joined, as a client sees them.
    let mut joined: Vec<Out> = Vec::new();
    for o in out {
        match (joined.last_mut(), o) {
            (Some(Out::Text(a)), Out::Text(b)) => a.push_str(&b),
            (_, o) => joined.push(o),
        }
    }
    joined
}

fn call(name: &str, args: &str) -> Out {
    Out::Call(Call {
        name: name.into(),
        arguments: args.into(),
    })
}

/// Every way of cutting `text` into two pieces parses as the whole does.
fn all_cuts(format: Format, text: &str, want: &[Out]) {
    assert_eq!(run(format, usize::MAX, &[text]), want, "whole: {text:?}");
    for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
        assert_eq!(
            run(format, usize::MAX, &[&text[..i], &text[i..]]),
            want,
            "cut at {i}: {text:?}"
        );
    }
}

#[test]
fn hermes_calls_come_out_whole_and_text_around_them_streams() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    all_cuts(
        Format::Hermes,
        text,
        &[
            Out::Text("Let me check.".into()),
            call("get_weather", r#"{"city":"Paris"}"#),
            call("get_time", "{}"),
        ],
    );
    // No call: the text as it came, a lone `<` included.
    all_cuts(
        Format::Hermes,
        "a < b, and <tool> is not a call",
        &[Out::Text("a < b, and <tool> is not a call".into())],
    );
    // Not JSON inside the tags: text.
    all_cuts(
        Format::Hermes,
        "<tool_call>oops</tool_call>",
        &[Out::Text("<tool_call>oops</tool_call>".into())],
    );
    // The output stopped before the closing tag: still a call.
    all_cuts(
        Format::Hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
        &[call("f", r#"{"x":1}"#)],
    );
}

#[test]
fn one_call_when_parallel_calls_are_off() {
    let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    assert_eq!(run(Format::Hermes, 1, &[text]), vec![call("a", "{}")]);
}

#[test]
fn text_is_not_held_longer_than_a_tag_could_be() {
    let mut p = Parser::new(Format::Hermes, usize::MAX);
    assert_eq!(p.feed("Hello wor"), vec![Out::Text("Hello wor".into())]);
    assert_eq!(p.feed("ld <tool"), vec![Out::Text("ld".into())]);
    assert_eq!(p.feed("s>"), vec![Out::Text(" <tools>".into())]);
}

#[test]
fn llama3_json_answers_are_calls_from_the_start() {
    all_cuts(
        Format::Llama3Json,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        &[call("get_weather", r#"{"city":"Paris"}"#)],
    );
    all_cuts(
        Format::Llama3Json,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": 2}}",
        &[call("a", "{}"), call("b", r#"{"n":2}"#)],
    );
    all_cuts(
        Format::Llama3Json,
        "The answer is 4.",
        &[Out::Text("The answer is 4.".into())],
    );
    // Looked like JSON, is not a call: text.
    all_cuts(
        Format::Llama3Json,
        "{\"x\": 1}",
        &[Out::Text("{\"x\": 1}".into())],
    );
}

#[test]
fn mistral_calls_in_both_generations_of_the_format() {
    all_cuts(
        Format::Mistral,
        "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", \"arguments\": {}}]",
        &[call("a", r#"{"q":"x"}"#), call("b", "{}")],
    );
    // The marker is a control token that decoding drops.
    all_cuts(
        Format::Mistral,
        "[{\"name\": \"a\", \"arguments\": {}}]",
        &[call("a", "{}")],
    );
    all_cuts(
        Format::Mistral,
        "[TOOL_CALLS]a[ARGS]{\"q\": 1}[TOOL_CALLS]b[ARGS]{}",
        &[call("a", r#"{"q":1}"#), call("b", "{}")],
    );
    all_cuts(
        Format::Mistral,
        "Sure.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]",
        &[Out::Text("Sure.".into()), call("a", "{}")],
    );
    all_cuts(Format::Mistral, "[1, 2]", &[Out::Text("[1, 2]".into())]);
}

#[test]
fn formats_are_told_from_templates() {
    assert_eq!(
        Format::detect("{% if tools %}<tool_call>{% endif %}"),
        Some(Format::Hermes)
    );
    assert_eq!(
        Format::detect("{% if tools %}[TOOL_CALLS]{% endif %}"),
        Some(Format::Mistral)
    );
    assert_eq!(
        Format::detect("{% if tools %}Environment: ipython{% endif %}"),
        Some(Format::Llama3Json)
    );
    assert_eq!(Format::detect("{{ messages }}<tool_call>"), None);
}

fn f(name: &str) -> Function {
    Function {
        name: name.into(),
        description: None,
        parameters: json!({"type": "object"}),
        strict: false,
    }
}

const N: Names = Names {
    tools: "tools",
    choice: "tool_choice",
};

#[test]
fn bad_tool_requests_are_refused_by_name() {
    let err = |fs: Vec<Function>, c: Option<Choice>| {
        let e = Tools::new(fs, c, true, N).unwrap_err();
        (e.param.unwrap_or_default(), e.message)
    };
    assert_eq!(err(vec![], Some(Choice::Required)).0, "tool_choice");
    assert!(Tools::new(vec![], Some(Choice::None), true, N)
        .unwrap()
        .is_none());
    assert!(err(vec![f("a b")], None).1.contains("a-z"));
    assert!(err(vec![f("a"), f("a")], None).1.contains("two functions"));
    assert!(err(vec![f("a")], Some(Choice::Named("b".into())))
        .1
        .contains("not among"));
    let mut strict = f("a");
    strict.strict = true;
    // Strict under `auto` is held to its schema once a call opens (below).
    assert!(Tools::new(vec![strict.clone()], None, true, N).is_ok());
    assert!(Tools::new(vec![strict], Some(Choice::Required), true, N).is_ok());
    let mut p = f("a");
    p.parameters = json!([]);
    assert!(err(vec![p], None).1.contains("JSON Schema object"));
    // The limits: 128 functions, 256 KiB of definitions.
    let many: Vec<Function> = (0..=MAX_TOOLS).map(|i| f(&format!("f{i}"))).collect();
    assert!(err(many, None).1.contains("at most 128 functions"));
    assert!(Tools::new(
        (0..MAX_TOOLS).map(|i| f(&format!("f{i}"))).collect(),
        None,
        true,
        N
    )
    .is_ok());
    let mut big = f("a");
    big.description = Some("x".repeat(MAX_TOOLS_BYTES));
    assert!(err(vec![big], None).1.contains("bytes; at most"));
}

/// Whether `c` takes `text` (tokenized) whole and then allows the end (`eos`).
fn grammar_takes(
    compiler: &cachet_backend::grammar::GrammarCompiler,
    tok: &cachet_backend::tokenizer::TextTokenizer,
    eos: u32,
    c: &Constraint,
    text: &str,
) -> bool {
    let mut m = compiler.compile(c).unwrap();
    for t in tok.encode(text).unwrap() {
        if m.consume(t).is_err() {
            return false;
        }
    }
    let mut mask = vec![0u32; tok.vocab_size().div_ceil(32)];
    m.mask(&mut mask).unwrap();
    mask[eos as usize / 32] >> (eos % 32) & 1 == 1
}

/// Each format's grammar, compiled against SmolLM2's vocabulary, takes a valid call
/// token by token and then allows the end; it refuses a function that was not offered (or
/// not named) and arguments outside the schema; what it takes parses back as the call.
#[test]
fn forced_calls_follow_each_formats_grammar() {
    use cachet_backend::grammar::GrammarCompiler;
    let tok = cachet_tests::smollm2().tokenizer.clone().unwrap();
    let eos = tok.token_id("<|im_end|>").unwrap();
    let compiler = GrammarCompiler::new(tok.clone(), eos, tok.vocab_size());
    let add = Function {
        name: "add".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false}),
        strict: true,
    };
    let clock = Function {
        name: "clock".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {}}),
        strict: false,
    };
    let takes = |c: &Constraint, text: &str| grammar_takes(&compiler, &tok, eos, c, text);
    for (format, ok, two, wrong_name, wrong_args) in [
        (
            Format::Hermes,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"clock\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"sub\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"one\", \"b\": 2}}\n</tool_call>",
        ),
        (
            Format::Llama3Json,
            "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
            "",
            "{\"name\": \"sub\", \"parameters\": {\"a\": 1, \"b\": 2}}",
            "{\"name\": \"add\", \"parameters\": {\"a\": 1}}",
        ),
        (
            Format::Mistral,
            "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
            "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"clock\", \"arguments\": {}}]",
            "[TOOL_CALLS][{\"name\": \"sub\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
            "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2, \"c\": 3}}]",
        ),
    ] {
        let tools = |choice: Choice, parallel: bool| Tools {
            functions: vec![add.clone(), clock.clone()],
            choice,
            parallel,
            max_calls: None,
        };
        let required = tools(Choice::Required, true).constraint(format, &tok).unwrap();
        assert!(takes(&required, ok), "{format}: {ok}");
        assert!(!takes(&required, wrong_name), "{format}: {wrong_name}");
        assert!(!takes(&required, wrong_args), "{format}: {wrong_args}");
        let named = tools(Choice::Named("clock".into()), true).constraint(format, &tok).unwrap();
        assert!(!takes(&named, ok), "{format}: named clock takes add");
        if !two.is_empty() {
            assert!(takes(&required, two), "{format}: two calls");
            let one = tools(Choice::Required, false).constraint(format, &tok).unwrap();
            assert!(!takes(&one, two), "{format}: two calls without parallel");
        }
        // What the grammar takes parses back as the calls.
        let mut p = Parser::new(format, usize::MAX);
        let mut outs = p.feed(ok);
        outs.extend(p.finish());
        assert_eq!(outs, vec![call("add", r#"{"a":1,"b":2}"#)], "{format}");
    }
    assert!(tools_none().constraint(Format::Hermes, &tok).is_none());
}

fn tools_none() -> Tools {
    Tools {
        functions: vec![f("a")],
        choice: Choice::Auto,
        parallel: true,
        max_calls: None,
    }
}

/// Under `auto` with a strict function (the OpenAI Agents SDK's and pydantic-ai's default): the
/// model may answer in text; once it opens a call, the call follows the schema — a strict
/// function's arguments its parameters, another's any object; text before a Hermes call is
/// allowed. Without a strict function `auto` has no grammar.
#[test]
fn strict_functions_under_auto_are_held_to_their_schema_once_a_call_opens() {
    use cachet_backend::grammar::GrammarCompiler;
    let tok = cachet_tests::smollm2().tokenizer.clone().unwrap();
    let eos = tok.token_id("<|im_end|>").unwrap();
    let compiler = GrammarCompiler::new(tok.clone(), eos, tok.vocab_size());
    let mut add = f("add");
    add.parameters = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false});
    add.strict = true;
    let clock = f("clock");
    let takes = |c: &Constraint, text: &str| grammar_takes(&compiler, &tok, eos, c, text);
    let tools = |functions: Vec<Function>, parallel: bool| Tools {
        functions,
        choice: Choice::Auto,
        parallel,
        max_calls: None,
    };
    let both = tools(vec![add.clone(), clock.clone()], true);
    let hermes = both.constraint(Format::Hermes, &tok).unwrap();
    let call = |name: &str, args: &str| {
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
    };
    for (text, want) in [
        ("Paris is sunny today.".to_string(), true),
        (String::new(), true),
        (call("add", "{\"a\": 1, \"b\": 2}"), true),
        (
            format!("Let me add them.\n{}", call("add", "{\"a\": 1, \"b\": 2}")),
            true,
        ),
        (call("clock", "{\"zone\": \"UTC\"}"), true),
        (
            format!(
                "{}\n{}",
                call("add", "{\"a\": 1, \"b\": 2}"),
                call("clock", "{}")
            ),
            true,
        ),
        (call("add", "{\"a\": \"one\", \"b\": 2}"), false),
        (format!("Sure.\n{}", call("add", "{\"a\": 1}")), false),
        (call("sub", "{\"a\": 1, \"b\": 2}"), false),
        (call("clock", "[1]"), false),
    ] {
        assert_eq!(takes(&hermes, &text), want, "hermes: {text:?}");
    }
    let one = tools(vec![add.clone(), clock.clone()], false)
        .constraint(Format::Hermes, &tok)
        .unwrap();
    assert!(!takes(
        &one,
        &format!(
            "{}\n{}",
            call("add", "{\"a\": 1, \"b\": 2}"),
            call("clock", "{}")
        )
    ));
    let llama = both.constraint(Format::Llama3Json, &tok).unwrap();
    assert!(takes(&llama, "Paris is sunny today."));
    assert!(takes(
        &llama,
        "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}"
    ));
    assert!(!takes(
        &llama,
        "{\"name\": \"add\", \"parameters\": {\"a\": 1}}"
    ));
    let mistral = both.constraint(Format::Mistral, &tok).unwrap();
    assert!(takes(&mistral, "Paris is sunny today."));
    assert!(takes(
        &mistral,
        "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]"
    ));
    assert!(!takes(
        &mistral,
        "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"b\": 2}}]"
    ));
    // No strict function: no grammar under auto.
    assert!(tools(vec![clock], true)
        .constraint(Format::Hermes, &tok)
        .is_none());
}

/// A call cut off by `max_tokens` is dropped, not returned as text: the text before it stays;
/// a call that parses still comes out; an output that ended on its own keeps the unparsed
/// remainder as text (the model chose to write it).
#[test]
fn a_call_cut_off_by_max_tokens_is_not_text() {
    let ended = |format: Format, text: &str, cut: bool| {
        let mut p = Parser::new(format, usize::MAX);
        let mut outs = p.feed(text);
        outs.extend(if cut { p.finish_cut() } else { p.finish() });
        let texts: String = outs
            .iter()
            .filter_map(|o| match o {
                Out::Text(t) => Some(t.as_str()),
                Out::Call(_) => None,
            })
            .collect();
        let calls = outs.iter().filter(|o| matches!(o, Out::Call(_))).count();
        (texts, calls)
    };
    let half = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"argum";
    let (text, calls) = ended(Format::Hermes, half, true);
    assert_eq!((text.trim_end(), calls), ("Let me check.", 0));
    let (text, _) = ended(Format::Hermes, half, false);
    assert!(text.contains("<tool_call>"), "{text}");
    let whole = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}";
    assert_eq!(ended(Format::Hermes, whole, true), (String::new(), 1));
    let llama = "{\"name\": \"add\", \"parameters\": {\"a\": 1";
    assert_eq!(ended(Format::Llama3Json, llama, true), (String::new(), 0));
    assert_eq!(ended(Format::Llama3Json, llama, false).0, llama);
}
