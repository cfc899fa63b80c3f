//! Function tools, one path for every API shape: the functions a request offers and its
//! `tool_choice`, checked; the `tools` the model's chat template renders; the grammar that makes
//! `required` and a named function certain (not hoped for); and the parser that turns the
//! model's output back into calls, as the text streams, in the model's own format.

use std::fmt;

use cachet_backend::grammar::Constraint;
use cachet_backend::tokenizer::TextTokenizer;
use serde_json::{json, Value};

use crate::http::ApiError;

/// Most functions one request may offer (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Most bytes of function definitions one request may send.
pub const MAX_TOOLS_BYTES: usize = 256 * 1024;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema for the arguments (an object).
    pub parameters: Value,
    /// The arguments must match the schema.
    pub strict: bool,
}

/// Whether and which function the model must call.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// The model decides: text, or calls.
    Auto,
    /// No call: the model answers in text (the functions are not shown to it).
    None,
    /// One call or more.
    Required,
    /// This function, once.
    Named(String),
}

/// A request's functions and how they may be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub functions: Vec<Function>,
    pub choice: Choice,
    /// More than one call per answer.
    pub parallel: bool,
    /// At most this many calls per answer (the Responses API's `max_tool_calls`).
    pub max_calls: Option<usize>,
}

/// The field names of one API shape's tool fields, for errors that name what to fix.
#[derive(Clone, Copy)]
pub struct Names {
    pub tools: &'static str,
    pub choice: &'static str,
}

impl Tools {
    /// Checks a request's functions and choice. `functions` are `(name, description,
    /// parameters, strict)` as the shape carries them (its own checks done); `None` when the
    /// request offers none and asks for none.
    pub fn new(
        functions: Vec<Function>,
        choice: Option<Choice>,
        parallel: bool,
        names: Names,
    ) -> Result<Option<Tools>, ApiError> {
        let bad = |m: String, p: &'static str| ApiError::bad_request(m, Some(p));
        if functions.is_empty() {
            return match choice {
                None | Some(Choice::None) => Ok(None),
                Some(_) => Err(bad(
                    format!("{} needs `{}` to name functions", names.choice, names.tools),
                    names.choice,
                )),
            };
        }
        if functions.len() > MAX_TOOLS {
            return Err(bad(
                format!("at most {MAX_TOOLS} functions per request"),
                names.tools,
            ));
        }
        let bytes: usize = functions
            .iter()
            .map(|f| f.name.len() + f.description.as_ref().map_or(0, String::len))
            .sum::<usize>()
            + functions
                .iter()
                .map(|f| f.parameters.to_string().len())
                .sum::<usize>();
        if bytes > MAX_TOOLS_BYTES {
            return Err(bad(
                format!("the functions take {bytes} bytes; at most {MAX_TOOLS_BYTES}"),
                names.tools,
            ));
        }
        for (i, f) in functions.iter().enumerate() {
            if !valid_name(&f.name) {
                return Err(bad(
                    format!(
                        "{}[{i}]: function name `{}` must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
                        names.tools, f.name
                    ),
                    names.tools,
                ));
            }
            if functions[..i].iter().any(|g| g.name == f.name) {
                return Err(bad(
                    format!("{}: two functions are named `{}`", names.tools, f.name),
                    names.tools,
                ));
            }
            if !f.parameters.is_object() {
                return Err(bad(
                    format!(
                        "{}[{i}]: the parameters of `{}` must be a JSON Schema object",
                        names.tools, f.name
                    ),
                    names.tools,
                ));
            }
            // The schema becomes part of a grammar when a call is forced: bounded like any.
            if let Err(e) = cachet_backend::grammar::limits::check_schema(&f.parameters) {
                return Err(bad(
                    format!("{}[{i}]: the parameters of `{}`: {e}", names.tools, f.name),
                    names.tools,
                ));
            }
        }
        let choice = choice.unwrap_or(Choice::Auto);
        if let Choice::Named(n) = &choice {
            if !functions.iter().any(|f| &f.name == n) {
                return Err(bad(
                    format!(
                        "{} names `{n}`, which is not among the functions",
                        names.choice
                    ),
                    names.choice,
                ));
            }
        }
        Ok(Some(Tools {
            functions,
            choice,
            parallel,
            max_calls: None,
        }))
    }

    /// What the chat template renders as `tools` (OpenAI's chat shape, which HF templates
    /// read), or nothing when the model must not call.
    pub fn template_tools(&self) -> Option<Value> {
        if self.choice == Choice::None {
            return None;
        }
        Some(
            self.functions
                .iter()
                .map(|f| {
                    let mut func = serde_json::Map::new();
                    func.insert("name".into(), f.name.clone().into());
                    if let Some(d) = &f.description {
                        func.insert("description".into(), d.clone().into());
                    }
                    func.insert("parameters".into(), f.parameters.clone());
                    json!({"type": "function", "function": func})
                })
                .collect(),
        )
    }

    /// Whether the output is parsed for calls.
    pub fn parses(&self) -> bool {
        self.choice != Choice::None
    }

    /// The most calls one answer may make.
    pub fn call_limit(&self) -> usize {
        match (&self.choice, self.parallel) {
            (Choice::Named(_), _) | (_, false) => 1,
            _ => self.max_calls.unwrap_or(usize::MAX),
        }
    }

    /// The grammar the output must match: for `required` one call or more (one unless
    /// parallel), for a named function exactly that call, each call's arguments under its
    /// function's schema; none for `auto` and `none`.
    pub fn constraint(&self, format: Format, tok: &TextTokenizer) -> Option<Constraint> {
        let functions: Vec<&Function> = match &self.choice {
            Choice::None => return None,
            // Under `auto` the model may answer in text; a strict function's arguments are
            // held to its schema once a call opens (OpenAI's and vLLM's `strict`).
            Choice::Auto if self.functions.iter().any(|f| f.strict) => {
                self.functions.iter().collect()
            }
            Choice::Auto => return None,
            Choice::Required => self.functions.iter().collect(),
            Choice::Named(n) => self.functions.iter().filter(|f| &f.name == n).collect(),
        };
        let auto = self.choice == Choice::Auto;
        let limit = self.call_limit();
        let args_key = format.arguments_key();
        let call_schema = |f: &Function| {
            // Under `auto` a function that is not strict takes any object as its arguments.
            let args = if auto && !f.strict {
                json!({"type": "object"})
            } else {
                f.parameters.clone()
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, args_key: args},
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        };
        let calls: Vec<Value> = functions.iter().map(|f| call_schema(f)).collect();
        let one = if calls.len() == 1 {
            calls.into_iter().next().expect("one")
        } else {
            json!({"anyOf": calls})
        };
        // Calls written as the chat templates write earlier ones (Python's `json.dumps`): the
        // model sees one way, and a free choice of whitespace could fill its budget.
        let compact = |mut s: Value| {
            s["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
            s
        };
        let grammar = match format {
            Format::Hermes => {
                let one = compact(one);
                let call = format!("call: \"<tool_call>\\n\" %json {one} \"\\n</tool_call>\"");
                let more = match limit {
                    1 => String::new(),
                    usize::MAX => "(\"\\n\" call)*".into(),
                    m => format!("(\"\\n\" call){{0,{}}}", m - 1),
                };
                if auto {
                    // Text without the marker, or text up to the first marker (a lazy lexeme:
                    // it ends there) and then calls.
                    format!(
                        "start: TEXT | opened %json {one} \"\\n</tool_call>\" {more}\n\
                         TEXT: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/\n\
                         opened[lazy]: /(?s:.*)<tool_call>\\n/\n{call}\n"
                    )
                } else {
                    format!("start: call {more}\n{call}\n")
                }
            }
            // A call is the whole answer: under `auto`, an answer that does not open with `{`.
            Format::Llama3Json if auto => format!(
                "start: TEXT | %json {}\nTEXT: /(?s:.*)/ & ~/(?s:\\s*\\{{.*)/\n",
                compact(one)
            ),
            Format::Llama3Json => format!("start: %json {}\n", compact(one)),
            Format::Mistral => {
                let mut list = json!({"type": "array", "items": one, "minItems": 1});
                if limit != usize::MAX {
                    list["maxItems"] = limit.into();
                }
                let list = compact(list);
                match tok.token_id(MISTRAL_MARKER) {
                    // A control token: text (which cannot hold one), or the marker and calls.
                    Some(id) if tok.is_special(id) && auto => {
                        format!("start: TEXT | <[{id}]> %json {list}\nTEXT: /(?s:.*)/\n")
                    }
                    Some(id) if tok.is_special(id) => format!("start: <[{id}]> %json {list}\n"),
                    // Plain text: as Hermes' marker.
                    _ if auto => format!(
                        "start: TEXT | opened %json {list}\n\
                         TEXT: /(?s:.*)/ & ~/(?s:.*\\[TOOL_CALLS\\].*)/\n\
                         opened[lazy]: /(?s:.*)\\[TOOL_CALLS\\]/\n"
                    ),
                    _ => format!("start: {MISTRAL_MARKER:?} %json {list}\n"),
                }
            }
        };
        Some(Constraint::Lark(grammar))
    }
}

/// The control tokens' texts must not reach the template's markup from a request: the function
/// definitions (`tools`, as the template gets them) are rendered by the template, not tokenized
/// as message text.
pub fn check_markup(tools: &Value, tok: &TextTokenizer, names: Names) -> Result<(), ApiError> {
    if let Some(s) = control_token_in(tools, tok) {
        return Err(ApiError::bad_request(
            format!(
                "the function definitions contain the model's control token `{s}`; take it out"
            ),
            Some(names.tools),
        ));
    }
    Ok(())
}

/// The first of the model's control tokens whose text is in `v` (which renders as markup).
pub fn control_token_in<'t>(v: &Value, tok: &'t TextTokenizer) -> Option<&'t String> {
    let text = v.to_string();
    tok.special_texts()
        .iter()
        .find(|s| text.contains(s.as_str()))
}

/// OpenAI's function names: 1 to 64 of `a-zA-Z0-9_-`.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARKER: &str = "[TOOL_CALLS]";
const LLAMA_PYTHON_TAG: &str = "<|python_tag|>";

/// How a model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Hermes, Qwen 2.5 and 3: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, after
    /// any text.
    Hermes,
    /// Llama 3.1 – 3.3: the whole answer is `{"name": …, "parameters": {…}}` (`; `-separated when
    /// several), maybe after `<|python_tag|>`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then `[{"name": …, "arguments": {…}}, …]` (or, in later
    /// tokenizers, `name[ARGS]{…}` per call).
    Mistral,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Hermes => "hermes",
            Format::Llama3Json => "llama3_json",
            Format::Mistral => "mistral",
        })
    }
}

impl std::str::FromStr for Format {
    type Err = cachet_backend::BadValue;
    fn from_str(s: &str) -> Result<Self, cachet_backend::BadValue> {
        match s {
            "hermes" | "qwen" => Ok(Format::Hermes),
            "llama3_json" | "llama3" => Ok(Format::Llama3Json),
            "mistral" => Ok(Format::Mistral),
            _ => Err(cachet_backend::BadValue::unknown(
                "tool-call format",
                s,
                "hermes, llama3_json, mistral, auto, none",
            )),
        }
    }
}

impl Format {
    /// The format a chat template writes calls in, if it renders tools at all.
    pub fn detect(template: &str) -> Option<Format> {
        if !template.contains("tools") {
            return None;
        }
        if template.contains(HERMES_OPEN) {
            Some(Format::Hermes)
        } else if template.contains(MISTRAL_MARKER) {
            Some(Format::Mistral)
        } else if template.contains(LLAMA_PYTHON_TAG) || template.contains("ipython") {
            Some(Format::Llama3Json)
        } else {
            None
        }
    }

    fn arguments_key(self) -> &'static str {
        match self {
            Format::Llama3Json => "parameters",
            Format::Hermes | Format::Mistral => "arguments",
        }
    }
}

/// A call the model made: its function and the arguments as compact JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// What the parser lets through: answer text, or a whole call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Text(String),
    Call(Call),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet (Llama 3 and Mistral answer with calls from the start).
    Start,
    /// Answer text.
    Text,
    /// Inside a Hermes call, after its opening tag.
    InCall,
    /// Everything to the end is calls (Llama 3 JSON, Mistral after its marker).
    Rest,
}

/// Splits a choice's streamed text into answer text and calls. Text streams as it comes, except
/// what could be the start of a call (held until it is known); a call comes out whole when it
/// closes (Hermes) or at the end (Llama 3, Mistral). Whitespace around calls is dropped; text
/// that looked like a call and is not one comes out as text.
pub struct Parser {
    format: Format,
    limit: usize,
    state: State,
    buf: String,
    /// Whitespace held until text follows (dropped when a call does).
    space: String,
    calls: usize,
}

impl Parser {
    /// A parser of `format` keeping at most `limit` calls (those after are dropped).
    pub fn new(format: Format, limit: usize) -> Self {
        Parser {
            format,
            limit,
            state: State::Start,
            buf: String::new(),
            space: String::new(),
            calls: 0,
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds the next text.
    pub fn feed(&mut self, text: &str) -> Vec<Out> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.step(&mut out, false);
        out
    }

    /// The output has ended: whatever was held comes out.
    pub fn finish(&mut self) -> Vec<Out> {
        self.finish_ended(false)
    }

    /// The output was cut off (`max_tokens`): a call it was writing that does not parse is
    /// dropped, not returned as text (the client asked for calls, and half of one is neither).
    pub fn finish_cut(&mut self) -> Vec<Out> {
        self.finish_ended(true)
    }

    fn finish_ended(&mut self, cut: bool) -> Vec<Out> {
        let mut out = Vec::new();
        self.step(&mut out, true);
        match self.state {
            State::InCall => {
                // An unclosed call (the output stopped after its JSON): a call if it parses.
                let body = std::mem::take(&mut self.buf);
                match self.call(&body) {
                    Some(c) => self.push_call(&mut out, c),
                    None if cut => {}
                    None => self.text(&mut out, format!("{HERMES_OPEN}{body}")),
                }
            }
            State::Rest => {
                let body = std::mem::take(&mut self.buf);
                match self.rest_calls(&body) {
                    Some(calls) => calls.into_iter().for_each(|c| self.push_call(&mut out, c)),
                    None if cut => {}
                    None => self.text(&mut out, body),
                }
            }
            State::Start | State::Text => {
                let rest = std::mem::take(&mut self.buf);
                self.text(&mut out, rest);
            }
        }
        if self.calls == 0 && !self.space.is_empty() {
            out.push(Out::Text(std::mem::take(&mut self.space)));
        }
        self.state = State::Text;
        out
    }

    fn step(&mut self, out: &mut Vec<Out>, end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    let start_marker = match self.format {
                        Format::Llama3Json => t.starts_with('{') || t.starts_with(LLAMA_PYTHON_TAG),
                        Format::Mistral => t.starts_with('[') || t.starts_with(MISTRAL_MARKER),
                        Format::Hermes => false,
                    };
                    let maybe_marker = !end
                        && matches!(self.format, Format::Llama3Json)
                        && LLAMA_PYTHON_TAG.starts_with(t);
                    if maybe_marker {
                        return;
                    }
                    self.state = if start_marker {
                        State::Rest
                    } else {
                        State::Text
                    };
                }
                State::Text => {
                    let open = match self.format {
                        Format::Hermes => HERMES_OPEN,
                        Format::Mistral => MISTRAL_MARKER,
                        Format::Llama3Json => {
                            let all = std::mem::take(&mut self.buf);
                            self.text(out, all);
                            return;
                        }
                    };
                    if let Some(at) = self.buf.find(open) {
                        let before = self.buf[..at].to_string();
                        self.text(out, before);
                        self.space.clear();
                        self.buf.drain(..at + open.len());
                        self.state = match self.format {
                            Format::Hermes => State::InCall,
                            _ => State::Rest,
                        };
                        continue;
                    }
                    // Hold back what could be the start of the opening tag.
                    let keep = if end {
                        0
                    } else {
                        partial_suffix(&self.buf, open)
                    };
                    let emit = self.buf[..self.buf.len() - keep].to_string();
                    self.buf.drain(..self.buf.len() - keep);
                    self.text(out, emit);
                    return;
                }
                State::InCall => {
                    let Some(at) = self.buf.find(HERMES_CLOSE) else {
                        return;
                    };
                    let body = self.buf[..at].to_string();
                    self.buf.drain(..at + HERMES_CLOSE.len());
                    match self.call(&body) {
                        Some(c) => self.push_call(out, c),
                        None => self.text(out, format!("{HERMES_OPEN}{body}{HERMES_CLOSE}")),
                    }
                    self.state = State::Text;
                }
                State::Rest => return,
            }
        }
    }

    /// Answer text: whitespace is held until something else follows, and dropped once a call
    /// has been made.
    fn text(&mut self, out: &mut Vec<Out>, s: String) {
        if s.is_empty() {
            return;
        }
        if s.trim().is_empty() {
            self.space.push_str(&s);
            return;
        }
        let mut t = std::mem::take(&mut self.space);
        if self.calls > 0 && t.trim().is_empty() {
            t.clear();
        }
        t.push_str(&s);
        // Trailing whitespace waits too: a call may follow.
        let trimmed = t.trim_end().len();
        self.space = t[trimmed..].to_string();
        t.truncate(trimmed);
        out.push(Out::Text(t));
    }

    fn push_call(&mut self, out: &mut Vec<Out>, c: Call) {
        self.space.clear();
        if self.calls >= self.limit {
            return; // no more calls were asked for: the rest are dropped
        }
        self.calls += 1;
        out.push(Out::Call(c));
    }

    /// One call's JSON: `{"name": …, "arguments" | "parameters": {…}}`.
    fn call(&self, body: &str) -> Option<Call> {
        call_of(&serde_json::from_str::<Value>(body.trim()).ok()?)
    }

    /// The calls of everything after the start (Llama 3) or the marker (Mistral).
    fn rest_calls(&self, body: &str) -> Option<Vec<Call>> {
        let t = body.trim();
        match self.format {
            Format::Llama3Json => {
                let t = t.strip_prefix(LLAMA_PYTHON_TAG).unwrap_or(t).trim();
                // One object, or several separated by `;`.
                let mut calls = Vec::new();
                let mut rest = t;
                while !rest.is_empty() {
                    let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                    let v = de.next()?.ok()?;
                    calls.push(call_of(&v)?);
                    rest = rest[de.byte_offset()..].trim_start();
                    rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
                }
                (!calls.is_empty()).then_some(calls)
            }
            Format::Mistral => {
                let t = t.strip_prefix(MISTRAL_MARKER).unwrap_or(t).trim();
                if t.starts_with('[') {
                    let v: Value = serde_json::from_str(t).ok()?;
                    let calls: Option<Vec<Call>> = v.as_array()?.iter().map(call_of).collect();
                    calls.filter(|c| !c.is_empty())
                } else {
                    // `name[ARGS]{…}`, one per `[TOOL_CALLS]`.
                    t.split(MISTRAL_MARKER)
                        .map(|part| {
                            let (name, args) = part.trim().split_once("[ARGS]")?;
                            let args: Value = serde_json::from_str(args.trim()).ok()?;
                            (valid_name(name.trim()) && args.is_object()).then(|| Call {
                                name: name.trim().to_string(),
                                arguments: args.to_string(),
                            })
                        })
                        .collect()
                }
            }
            Format::Hermes => None,
        }
    }
}

/// A call of a parsed object, if it is one.
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?;
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    // Some models write the arguments as a JSON string.
    let args = match args {
        Value::String(s) => serde_json::from_str(&s).ok()?,
        a => a,
    };
    (valid_name(name) && args.is_object()).then(|| Call {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// The length of the longest end of `s` that is a proper start of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// A call's id, unique per response, choice and call (`prefix` as the API spells them:
/// `call_`, `toolu_`, `fc_`).
pub fn call_id(prefix: &str, response: &str, choice: usize, k: usize) -> String {
    let mut h = blake3::Hasher::new();
    h.update(response.as_bytes());
    h.update(&(choice as u64).to_le_bytes());
    h.update(&(k as u64).to_le_bytes());
    let hex = crate::protocol::hex(&h.finalize().as_bytes()[..12]);
    format!("{prefix}{hex}")
}

#[cfg(test)]
mod tests;
