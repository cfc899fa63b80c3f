//! Typed errors of the engine library, one enum per subsystem.

use std::path::PathBuf;

/// Errors raised while finding, fetching, parsing or converting a model.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model not found at {path}: {hint}")]
    NotFound { path: PathBuf, hint: String },
    #[error("{path}: unsupported architecture `{arch}` (supported: llama / LlamaForCausalLM and Llama-family GGUF)")]
    UnknownArchitecture { path: PathBuf, arch: String },
    #[error("{path}: tensor `{tensor}` has unsupported dtype {dtype} (supported: {supported})")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
        supported: &'static str,
    },
    #[error(
        "{path}: file is truncated: {what} needs {needed} bytes but only {available} are there"
    )]
    Truncated {
        path: PathBuf,
        what: String,
        needed: u64,
        available: u64,
    },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("fetching {model}: {msg}")]
    Fetch { model: String, msg: String },
    #[error(transparent)]
    Hub(Box<HubError>),
}

impl From<HubError> for LoadError {
    fn from(e: HubError) -> Self {
        LoadError::Hub(Box::new(e))
    }
}

/// Why a model could not be had from the Hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{repo} is gated or private on {endpoint}: set HF_TOKEN to a token that has access (request access on the model's page first)")]
    NeedsToken { repo: String, endpoint: String },
    #[error("the token from {token_from} has no access to {repo} on {endpoint}: request access on the model's page, or use a token that has it")]
    NoAccess {
        repo: String,
        endpoint: String,
        token_from: String,
    },
    #[error("no model {repo} at revision `{revision}` on {endpoint}: check the id and --revision")]
    NotFound {
        repo: String,
        revision: String,
        endpoint: String,
    },
    #[error("{repo} (revision `{revision}`) is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE is set: download it once with the Hub reachable")]
    NotCached {
        repo: String,
        revision: String,
        cache: PathBuf,
    },
    #[error("{repo} has no `{file}` (its files: {listing})")]
    NoFile {
        repo: String,
        file: String,
        listing: String,
    },
    #[error(
        "{repo} ships no safetensors or GGUF weights (its files: {listing}); Cachet reads those"
    )]
    NoWeights { repo: String, listing: String },
    #[error("{repo} holds several GGUF files ({files}): name one, as `{repo}/FILE.gguf`")]
    WhichGguf { repo: String, files: String },
    #[error("{repo}: {file} as downloaded has {algorithm} {got}, but the Hub names it {expected}: the download was corrupted and is deleted; run again to fetch it anew")]
    HashMismatch {
        repo: String,
        file: String,
        algorithm: &'static str,
        expected: String,
        got: String,
    },
    #[error("{repo}: {what} from {endpoint}: {source}")]
    Request {
        repo: String,
        what: String,
        endpoint: String,
        #[source]
        source: Box<hf_hub::api::sync::ApiError>,
    },
    #[error("--revision {revision} is for a model by Hugging Face id (org/name); `{spec}` is a local path or a built-in model")]
    RevisionOfLocal { spec: String, revision: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl LoadError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            return LoadError::NotFound {
                path,
                hint: "no such file or directory".into(),
            };
        }
        LoadError::Io { path, source }
    }
    pub(crate) fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        LoadError::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

/// Errors raised by a device (CPU or CUDA) while running the model.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{device}: out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory {
        device: &'static str,
        bytes: usize,
        what: String,
    },
    /// An operation refused or failed for a reason of this crate's own (a shape, a limit).
    #[error("{device}: {op}: {msg}")]
    Op {
        device: &'static str,
        op: &'static str,
        msg: String,
    },
    /// A call into the device's driver or a library that failed; its error kept as the cause.
    #[error("{device}: {op}: {source}")]
    Driver {
        device: &'static str,
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("device `{0}` is not available: {1}")]
    Unavailable(String, String),
}

/// Errors of a forward pass or a generation run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("KV cache is full: {needed} blocks needed, {free} free")]
    KvCacheFull { needed: usize, free: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The model's chat template failed (not a refusal of the conversation through
    /// `raise_exception`, which is [`EngineError::InvalidRequest`]).
    #[error("the model's chat template failed: {0}")]
    Template(String),
    #[error("engine overloaded: {waiting} requests already waiting (limit {limit}); retry later")]
    Overloaded { waiting: usize, limit: usize },
    #[error("engine overloaded: {queued} prompt tokens already waiting, this prompt has {prompt} (limit {limit}); retry later")]
    OverloadedTokens {
        queued: usize,
        prompt: usize,
        limit: usize,
    },
    #[error("structured outputs: all {limit} grammar compilers stayed busy for {waited_ms} ms; retry later")]
    GrammarBusy { limit: usize, waited_ms: u64 },
    #[error("engine is shut down")]
    Shutdown,
}

impl EngineError {
    /// Whether the engine refused for load (the same request may succeed later: 503 +
    /// Retry-After), not for what the request is.
    pub fn is_overload(&self) -> bool {
        matches!(
            self,
            EngineError::Overloaded { .. }
                | EngineError::OverloadedTokens { .. }
                | EngineError::GrammarBusy { .. }
        )
    }
}

/// A setting's value (a flag, a config entry) that is not one of its choices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    #[error("unknown {what} `{got}` ({choices})")]
    Unknown {
        what: &'static str,
        got: String,
        choices: &'static str,
    },
    #[error("{what} `{got}` is not supported: {instead}")]
    Unsupported {
        what: &'static str,
        got: String,
        instead: &'static str,
    },
}

impl BadValue {
    /// `got` is not one of `choices`, the values `what` takes.
    pub fn unknown(what: &'static str, got: &str, choices: &'static str) -> Self {
        BadValue::Unknown {
            what,
            got: got.to_string(),
            choices,
        }
    }
}
