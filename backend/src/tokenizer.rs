//! Text ↔ token ids, chat templates, and incremental detokenisation for streaming.

use std::path::Path;

use crate::error::{EngineError, LoadError};

mod ascii;
pub(crate) use ascii::{LLAMA3_SPLIT, QWEN2_SPLIT};
mod jinja;
mod layout;
mod pyjson;
mod pystr;

/// One chat message, as in the OpenAI API: the template ABI's message, so one shape carries a
/// message from the gateway's API through a tenant's template to the chat template.
pub use cachet_guest_sdk::Message as ChatMessage;
pub use cachet_guest_sdk::ToolCall;

fn plain_of(inner: &tokenizers::Tokenizer) -> std::sync::Arc<tokenizers::Tokenizer> {
    let mut plain = inner.clone();
    plain.set_encode_special_tokens(true);
    std::sync::Arc::new(plain)
}

/// A model's tokenizer plus its chat template.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens taken as plain text (for message text: a user's
    /// `<|im_start|>` must not become the control token).
    plain: std::sync::Arc<tokenizers::Tokenizer>,
    /// ASCII message text through `plain`'s model without its pipeline, where the pipeline is
    /// a byte-level BPE one it reproduces ([`ascii`]).
    ascii: Option<std::sync::Arc<ascii::AsciiBpe>>,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The chat template compiled once (rendering runs per request), or why it does not compile.
    compiled: std::sync::Arc<std::sync::OnceLock<Result<Compiled, BadTemplate>>>,
    /// A model's named `tool_use` template (Hermes, Command R): used instead of the default when
    /// a request has tools, as transformers chooses; compiled apart.
    tool_template: Option<String>,
    compiled_tools: std::sync::Arc<std::sync::OnceLock<Result<Compiled, BadTemplate>>>,
    /// See [`TextTokenizer::for_dummy_model`]: the model's vocabulary size, and the ids of this
    /// tokenizer that decode on their own to visible text.
    wrap_ids: Option<(u32, std::sync::Arc<Vec<u32>>)>,
    /// The special tokens' texts (see [`TextTokenizer::special_texts`]).
    specials: std::sync::Arc<Vec<String>>,
}

impl TextTokenizer {
    pub fn new(
        inner: tokenizers::Tokenizer,
        chat_template: Option<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Self {
        let specials = inner
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content.clone())
            .collect();
        let plain = plain_of(&inner);
        TextTokenizer {
            ascii: ascii::AsciiBpe::of(&plain).map(std::sync::Arc::new),
            plain,
            specials: std::sync::Arc::new(specials),
            inner,
            chat_template,
            bos_token,
            eos_token,
            compiled: Default::default(),
            tool_template: None,
            compiled_tools: Default::default(),
            wrap_ids: None,
        }
    }

    /// `tokenizer.json` + (optional) `tokenizer_config.json` of an HF directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| LoadError::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let (mut chat_template, mut tool_template, mut bos, mut eos) = (None, None, None, None);
        if cfg_path.exists() {
            let text =
                std::fs::read_to_string(&cfg_path).map_err(|e| LoadError::io(&cfg_path, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| LoadError::Json {
                    path: cfg_path.clone(),
                    source,
                })?;
            (chat_template, tool_template) = named_templates(&cfg_path, v.get("chat_template"))?;
            let tok = |k: &str| {
                v.get(k).and_then(|t| {
                    t.as_str()
                        .map(String::from)
                        .or_else(|| t.get("content").and_then(|c| c.as_str()).map(String::from))
                })
            };
            bos = tok("bos_token");
            eos = tok("eos_token");
        }
        let jinja = dir.join("chat_template.jinja");
        if chat_template.is_none() && jinja.exists() {
            chat_template =
                Some(std::fs::read_to_string(&jinja).map_err(|e| LoadError::io(&jinja, e))?);
        }
        Ok(TextTokenizer::new(inner, chat_template, bos, eos).with_tool_template(tool_template))
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The template a request with tools renders with: the model's `tool_use` template when
    /// it has one, else the chat template (for telling its tool-call format).
    pub fn tools_template(&self) -> Option<&str> {
        self.tool_template
            .as_deref()
            .or(self.chat_template.as_deref())
    }

    /// With `template` as the named `tool_use` template (None: the chat template serves tools).
    pub fn with_tool_template(mut self, template: Option<String>) -> Self {
        self.tool_template = template;
        self.compiled_tools = Default::default();
        self
    }

    /// Encodes `text`; special tokens written in the text (e.g. `<|im_start|>`) become their ids.
    /// For text the model's own markup produced (a chat template's rendering) or a raw
    /// completion prompt; message text goes through [`TextTokenizer::encode_plain`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.encode_with(&self.inner, text, false)
    }

    /// Encodes a prompt given as text (a completion's, not a rendered chat): what the tokenizer
    /// adds around a sequence, such as the BOS of Gemma, Llama 2 and Llama 3, is added, as
    /// transformers and vLLM do.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.encode_with(&self.inner, text, true)
    }

    /// Encodes `text` with special tokens as plain text: `<|im_start|>` in it becomes the tokens
    /// of those characters, never the control token.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        if let Some(ids) = self
            .ascii
            .as_ref()
            .and_then(|a| a.encode(&self.plain, text))
        {
            let ids = ids.map_err(|e| EngineError::Tokenizer(e.to_string()))?;
            return Ok(self.wrapped(ids));
        }
        self.encode_with(&self.plain, text, false)
    }

    /// Whether [`TextTokenizer::encode_plain`] takes ASCII text past the library's pipeline.
    pub fn has_ascii_path(&self) -> bool {
        self.ascii.is_some()
    }

    /// [`TextTokenizer::encode_plain`] through the library's pipeline only (the reference the
    /// ASCII path is checked against).
    pub fn encode_plain_reference(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.encode_with(&self.plain, text, false)
    }

    /// Ids of this tokenizer as the model's (see [`TextTokenizer::for_dummy_model`]).
    fn wrapped(&self, mut ids: Vec<u32>) -> Vec<u32> {
        if let Some((m, _)) = &self.wrap_ids {
            ids.iter_mut().for_each(|i| *i %= m);
        }
        ids
    }

    /// Encodes with `t`; `sequence`: with what the tokenizer adds around a sequence (BOS).
    fn encode_with(
        &self,
        t: &tokenizers::Tokenizer,
        text: &str,
        sequence: bool,
    ) -> Result<Vec<u32>, EngineError> {
        // Ids only: no character offsets tracked (the same ids, less work per call).
        let enc = t
            .encode_fast(text, sequence)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(self.wrapped(enc.get_ids().to_vec()))
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, EngineError> {
        let wrapped: Vec<u32>;
        let ids = match &self.wrap_ids {
            Some((_, plain)) => {
                wrapped = ids
                    .iter()
                    .map(|&i| plain[i as usize % plain.len()])
                    .collect();
                &wrapped[..]
            }
            None => ids,
        };
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    }

    /// The bytes token `id` stands for (OpenAI's logprobs `bytes`): a byte-level BPE token's
    /// bytes through GPT-2's byte ↔ character table, a SentencePiece byte token `<0xNN>` its
    /// byte, `▁` a space, anything else (special tokens included) its text's UTF-8. Empty for an
    /// id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let id = match &self.wrap_ids {
            Some((_, plain)) => plain[id as usize % plain.len()],
            None => id,
        };
        let Some(tok) = self.inner.id_to_token(id) else {
            return Vec::new();
        };
        let byte_level = matches!(
            self.inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        let special = self
            .inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special);
        if byte_level && !special {
            if let Some(b) = tok.chars().map(byte_of_char).collect::<Option<Vec<u8>>>() {
                return b;
            }
        }
        if let Some(hex) = tok.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
        tok.replace('\u{2581}', " ").into_bytes()
    }

    /// Serves a model with random weights and a vocabulary of `model_vocab` ids of its own
    /// through this tokenizer: prompt ids are taken modulo the model's vocabulary, generated ids
    /// are shown as this tokenizer's *plain* tokens (those that decode on their own to visible
    /// text: no special tokens, no partial UTF-8 bytes), so each generated token streams as text
    /// the moment it is made, as a real model's would (text-level timings stay meaningful).
    pub fn for_dummy_model(mut self, model_vocab: usize) -> Self {
        let plain: Vec<u32> = (0..self.vocab_size() as u32)
            .filter(|&i| {
                self.inner
                    .decode(&[i], true)
                    .is_ok_and(|t| !t.trim().is_empty() && !t.contains('\u{FFFD}'))
            })
            .collect();
        let plain = if plain.is_empty() {
            (0..self.vocab_size().max(1) as u32).collect()
        } else {
            plain
        };
        self.wrap_ids = Some((model_vocab.max(1) as u32, std::sync::Arc::new(plain)));
        self
    }

    /// Serves this model with another chat template (`--chat-template`): one that renders
    /// tools, say, where the model's own does not.
    pub fn with_chat_template(mut self, template: String) -> Self {
        self.chat_template = Some(template);
        self.compiled = Default::default();
        // A template given in place of the model's serves every request.
        self.with_tool_template(None)
    }

    /// Renders a plain conversation (a system message and a user's, with the generation
    /// prompt; a template that takes no system message, the user's alone): `Ok` when the model
    /// has no chat template or its template renders, else why not — for refusing a template
    /// at start rather than on every request.
    pub fn probe_chat_template(&self) -> Result<(), EngineError> {
        if self.chat_template.is_none() {
            return Ok(());
        }
        let user = ChatMessage::new("user", "Hello!");
        let with_system = [ChatMessage::new("system", "You are helpful."), user.clone()];
        let probe = |tools: Option<&serde_json::Value>| {
            match self.render_chat_direct(&with_system, tools, None, true) {
                Ok(_) => Ok(()),
                // Some templates refuse a system message (Gemma 2): the user's alone must render.
                Err(EngineError::InvalidRequest(_)) => self
                    .render_chat_direct(std::slice::from_ref(&user), tools, None, true)
                    .map(|_| ()),
                Err(e) => Err(e),
            }
        };
        probe(None)?;
        if self.tool_template.is_some() {
            let tool = serde_json::json!([{"type": "function", "function": {
                "name": "probe", "description": "A tool.",
                "parameters": {"type": "object", "properties": {}}}}]);
            probe(Some(&tool))?;
        }
        Ok(())
    }

    /// The texts of the special (control) tokens: text that must not reach the template's
    /// markup from a request.
    pub fn special_texts(&self) -> &[String] {
        &self.specials
    }

    /// Renders `messages` with the model's chat template.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.render_chat_with(messages, None, None, add_generation_prompt)
    }

    /// Names a chat template gets from the renderer, which `chat_template_kwargs` may not set.
    pub const TEMPLATE_NAMES: [&'static str; 5] = [
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
    ];

    /// Renders `messages` and `tools` (OpenAI's function tools, `[{"type": "function",
    /// "function": {...}}]`, what HF chat templates take as `tools`) with the model's chat
    /// template, as transformers' `apply_chat_template` does: blocks trimmed, `tojson` as
    /// Python's `json.dumps`, an assistant's tool calls with their arguments as objects. `kwargs`
    /// are further variables for the template (`chat_template_kwargs`, e.g. Qwen3's
    /// `enable_thinking`); they cannot replace [`TextTokenizer::TEMPLATE_NAMES`].
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.render_chat_in(&[], messages, tools, kwargs, add_generation_prompt)
    }

    /// [`TextTokenizer::render_chat_with`], with the layouts this rendering may reuse kept
    /// apart under `partition` (the gateway passes the tenant's cache salt: a tenant cannot
    /// tell from a rendering's speed which layouts — tools, tool calls — another one used).
    pub fn render_chat_in(
        &self,
        partition: &[u8],
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let compiled = self.compiled(tools.is_some())?;
        self.check_kwargs(kwargs)?;
        // A template that only copies contents (`layout`): one rendering per layout, contents
        // spliced in.
        if let Ok(layouts) = &compiled.layouts {
            let key = layout_key(partition, messages, tools, kwargs, add_generation_prompt);
            let layout = match layouts.get(&key) {
                Some(l) => Some(l),
                None => {
                    let held = with_contents(messages, |i, _| layouts.placeholder(i));
                    let rendered = self.render_engine(
                        &compiled.env,
                        &held,
                        tools,
                        kwargs,
                        add_generation_prompt,
                    )?;
                    let has: Vec<bool> = messages.iter().map(|m| !m.content.is_empty()).collect();
                    layouts.insert(key, rendered, &has)
                }
            };
            if let Some(l) = layout {
                let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
                return Ok(l.splice(&contents));
            }
        }
        self.render_engine(
            &compiled.env,
            messages,
            tools,
            kwargs,
            add_generation_prompt,
        )
    }

    /// [`TextTokenizer::render_chat_with`] through the template engine every time (the
    /// reference the layout cache is tested against).
    pub fn render_chat_direct(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let compiled = self.compiled(tools.is_some())?;
        self.check_kwargs(kwargs)?;
        self.render_engine(
            &compiled.env,
            messages,
            tools,
            kwargs,
            add_generation_prompt,
        )
    }

    /// Whether chat prompts are rendered once per layout (the template only copies message
    /// contents), or why not — for the serving log.
    pub fn chat_layouts(&self) -> Result<(), layout::NotReusable> {
        match self.compile(false) {
            None => Err(layout::NotReusable::NoTemplate),
            Some(Err(e)) => Err(layout::NotReusable::Parse(e.0.clone())),
            Some(Ok(c)) => c.layouts.as_ref().map(|_| ()).map_err(Clone::clone),
        }
    }

    /// Whether the template a request with `tools` (or without) renders with only copies
    /// message contents (its renderings are reused with other contents spliced in).
    pub fn reuses_layouts(&self, tools: bool) -> bool {
        matches!(self.compile(tools), Some(Ok(c)) if c.layouts.is_ok())
    }

    fn compiled(&self, tools: bool) -> Result<&Compiled, EngineError> {
        match self.compile(tools) {
            None => Err(EngineError::InvalidRequest(
                "this model has no chat template; send a plain completion instead".into(),
            )),
            Some(c) => c
                .as_ref()
                .map_err(|e| EngineError::Template(format!("{e}: {}", e.0))),
        }
    }

    /// The template for a request with `tools` or without compiled (once), or `None` without
    /// one.
    fn compile(&self, tools: bool) -> Option<&Result<Compiled, BadTemplate>> {
        let (template, cell) = match (&self.tool_template, tools) {
            (Some(t), true) => (t.as_str(), &self.compiled_tools),
            _ => (self.chat_template.as_deref()?, &self.compiled),
        };
        Some(cell.get_or_init(|| {
            let env =
                jinja::environment(template).map_err(|e| BadTemplate(std::sync::Arc::new(e)))?;
            Ok(Compiled {
                env,
                layouts: layout::opacity(template).map(|()| layout::Layouts::new()),
            })
        }))
    }

    fn check_kwargs(
        &self,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(), EngineError> {
        match kwargs
            .into_iter()
            .flat_map(|k| k.keys())
            .find(|k| Self::TEMPLATE_NAMES.contains(&k.as_str()))
        {
            Some(k) => Err(EngineError::InvalidRequest(format!(
                "chat_template_kwargs may not set `{k}`: the renderer sets it"
            ))),
            None => Ok(()),
        }
    }

    fn render_engine(
        &self,
        env: &minijinja::Environment<'static>,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let tmpl = env.get_template("chat").expect("added at compile time");
        let messages: Vec<minijinja::Value> = messages.iter().map(template_message).collect();
        let base = minijinja::context! {
            messages => minijinja::Value::from(messages),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        let ctx = match kwargs {
            Some(k) => minijinja::context! { ..base, ..minijinja::Value::from_serialize(k) },
            None => base,
        };
        tmpl.render(ctx).map_err(|e| match jinja::raised(&e) {
            // The template refusing the conversation: the client's to fix.
            Some(msg) => EngineError::InvalidRequest(format!("{}: {msg}", jinja::RAISED)),
            None => EngineError::Template(e.to_string()),
        })
    }
}

/// `tokenizer_config.json`'s `chat_template`: one template, or a list of named ones
/// (`[{"name": "default", "template": …}, {"name": "tool_use", …}]`), of which the `default` and
/// `tool_use` ones are served (transformers' choice: `tool_use` when a request has tools).
fn named_templates(
    path: &Path,
    v: Option<&serde_json::Value>,
) -> Result<(Option<String>, Option<String>), LoadError> {
    use serde_json::Value;
    match v {
        None | Some(Value::Null) => Ok((None, None)),
        Some(Value::String(t)) => Ok((Some(t.clone()), None)),
        Some(Value::Array(list)) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(String::from)
            };
            let (default, tools) = (named("default"), named("tool_use"));
            if default.is_none() && tools.is_none() {
                let names: Vec<&str> = list
                    .iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str))
                    .collect();
                return Err(LoadError::format(
                    path,
                    format!("chat_template names {names:?}: none is `default` or `tool_use`"),
                ));
            }
            Ok((default, tools))
        }
        Some(_) => Err(LoadError::format(
            path,
            "chat_template is a string or a list of {name, template}",
        )),
    }
}

/// A compiled chat template: the engine's environment, and its layout cache when the template
/// only copies message contents (`layout::opacity`).
struct Compiled {
    env: minijinja::Environment<'static>,
    /// Why not, when the template does more with a content than copy it.
    layouts: Result<layout::Layouts, layout::NotReusable>,
}

/// A chat template that does not compile.
#[derive(Debug, Clone, thiserror::Error)]
#[error("chat template does not parse")]
struct BadTemplate(#[source] std::sync::Arc<minijinja::Error>);

/// The partition, then what a conversation's rendering depends on besides its contents' text: each message's role,
/// whether its content is empty, its tool calls, tool call id, name and thinking; the tools; the template
/// variables; the generation prompt. Text fields are length-prefixed, JSON written whole (no two
/// layouts share a key).
/// JSON of either shape a layout key hashes.
mod erased {
    pub trait Json {
        fn write(&self, h: &mut blake3::Hasher);
    }
    impl<T: serde::Serialize> Json for T {
        fn write(&self, h: &mut blake3::Hasher) {
            serde_json::to_writer(h, self).expect("JSON writes to a hasher");
        }
    }
}

fn layout_key(
    partition: &[u8],
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    add_generation_prompt: bool,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let field = |h: &mut blake3::Hasher, b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    h.update(b"cachet chat layout 2");
    field(&mut h, partition);
    h.update(&[add_generation_prompt as u8]);
    // JSON values end where they end: written straight into the hash, unprefixed.
    let json = |h: &mut blake3::Hasher, v: Option<&dyn erased::Json>| match v {
        Some(v) => {
            h.update(&[1]);
            v.write(h);
        }
        None => {
            h.update(&[0]);
        }
    };
    json(&mut h, tools.map(|t| t as &dyn erased::Json));
    json(&mut h, kwargs.map(|k| k as &dyn erased::Json));
    h.update(&(messages.len() as u64).to_le_bytes());
    for m in messages {
        field(&mut h, m.role.as_bytes());
        h.update(&[m.content.is_empty() as u8]);
        match &m.tool_call_id {
            Some(id) => {
                h.update(&[1]);
                field(&mut h, id.as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
        // Names and thinking are rendered as they are, not as placeholders: all of their text
        // is the layout's.
        for text in [&m.name, &m.reasoning_content] {
            match text {
                Some(t) => {
                    h.update(&[1]);
                    field(&mut h, t.as_bytes());
                }
                None => {
                    h.update(&[0]);
                }
            }
        }
        h.update(&(m.tool_calls.len() as u64).to_le_bytes());
        for c in &m.tool_calls {
            field(&mut h, c.id.as_bytes());
            field(&mut h, c.name.as_bytes());
            field(&mut h, c.arguments.as_bytes());
        }
    }
    *h.finalize().as_bytes()
}

/// `messages` with every non-empty content replaced by `f(index, content)` (empty ones stay
/// empty: templates test `if message.content`).
pub fn with_contents(
    messages: &[ChatMessage],
    f: impl Fn(usize, &str) -> String,
) -> Vec<ChatMessage> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut x = m.clone();
            if !m.content.is_empty() {
                x.content = f(i, &m.content);
            }
            x
        })
        .collect()
}

/// A message as HF chat templates read it: `role`, `content`, and where there are some,
/// `tool_calls` (`{"id", "type": "function", "function": {"name", "arguments"}}`, the arguments
/// an object, as transformers passes them), `tool_call_id`, `name` and `reasoning_content`. Built as the template engine's own
/// values (a map keeping this key order), without a JSON tree in between.
fn template_message(m: &ChatMessage) -> minijinja::Value {
    use minijinja::Value;
    let mut fields: Vec<(&str, Value)> = Vec::with_capacity(4);
    fields.push(("role", Value::from(m.role.as_str())));
    fields.push(("content", Value::from(m.content.as_str())));
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = match serde_json::from_str::<serde_json::Value>(&c.arguments) {
                    Ok(v) => Value::from_serialize(&v),
                    Err(_) => Value::from(c.arguments.as_str()),
                };
                let function =
                    Value::from_iter([("name", Value::from(c.name.as_str())), ("arguments", args)]);
                Value::from_iter([
                    ("id", Value::from(c.id.as_str())),
                    ("type", Value::from("function")),
                    ("function", function),
                ])
            })
            .collect();
        fields.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &m.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &m.name {
        fields.push(("name", Value::from(name.as_str())));
    }
    if let Some(r) = &m.reasoning_content {
        fields.push(("reasoning_content", Value::from(r.as_str())));
    }
    Value::from_iter(fields)
}

/// Turns a growing list of token ids into text pieces, never splitting a multi-byte character
/// (byte-level BPE tokens can end inside one).
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>, EngineError> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], true)?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }
}

/// GPT-2's byte-level alphabet, inverted: the byte a character of a byte-level BPE token
/// stands for. Printable bytes (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) stand for themselves; the other 68
/// bytes were shifted to U+0100.. in byte order.
/// Bytes GPT-2's byte-level table spells as themselves; the others take U+0100 onwards, in
/// order.
const fn printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff)
}

/// GPT-2's character for byte `b` ([`byte_of_char`]'s inverse).
pub(crate) fn char_of_byte(b: u8) -> char {
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + n).expect("below U+0200")
}

fn byte_of_char(c: char) -> Option<u8> {
    // The 68 shifted bytes, in order (U+0100 + k stands for SHIFTED[k]).
    const SHIFTED: [u8; 68] = {
        let mut t = [0u8; 68];
        let (mut b, mut k) = (0usize, 0usize);
        while b < 256 {
            if !printable(b as u8) {
                t[k] = b as u8;
                k += 1;
            }
            b += 1;
        }
        t
    };
    let u = c as u32;
    if u <= 0xff {
        return printable(u as u8).then_some(u as u8);
    }
    SHIFTED.get(u.checked_sub(0x100)? as usize).copied()
}

#[cfg(test)]
mod byte_level_tests {
    use super::byte_of_char;

    #[test]
    fn gpt2_byte_alphabet_round_trips() {
        assert_eq!(byte_of_char('A'), Some(b'A'));
        assert_eq!(byte_of_char('\u{120}'), Some(b' ')); // Ġ
        assert_eq!(byte_of_char('\u{10a}'), Some(b'\n')); // Ċ
        assert_eq!(byte_of_char('\u{100}'), Some(0));
        assert_eq!(byte_of_char(' '), None);
        let all: std::collections::BTreeSet<u8> = (0..0x200u32)
            .filter_map(char::from_u32)
            .filter_map(byte_of_char)
            .collect();
        assert_eq!(all.len(), 256);
    }
}
