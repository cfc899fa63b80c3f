//! [`TemplateError`]: why a template could not be stored or run, with the API code and HTTP
//! status each reason answers with.

use std::time::Duration;

/// Why a template could not be stored or run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    #[error("the upload is not a WebAssembly module: {0}")]
    NotWasm(String),
    #[error("the module is {size} bytes; the limit is {limit}")]
    ModuleTooLarge { size: usize, limit: usize },
    #[error("the module must export {what}")]
    MissingExport { what: String },
    #[error("the module imports `{module}.{name}`; templates may import only `cachet.log` (i32, i32) -> ()")]
    ForbiddenImport { module: String, name: String },
    #[error("the module speaks template ABI version {found}; this gateway speaks {expected}")]
    AbiVersion { found: i64, expected: u32 },
    #[error("template `{0}` not found")]
    NotFound(String),
    #[error("template `{name}` has no version {version}")]
    NoSuchVersion { name: String, version: u32 },
    #[error("version {version} of `{name}` is active; activate another version first")]
    VersionActive { name: String, version: u32 },
    #[error("template names are 1-64 characters of a-z, 0-9, `-` and `_`; got `{0}`")]
    BadName(String),
    #[error("the template ran past its {0:?} deadline")]
    Timeout(Duration),
    #[error("the template used up its fuel ({0} units)")]
    OutOfFuel(u64),
    #[error("the template went over its memory limit of {limit} bytes")]
    OutOfMemory { limit: usize },
    #[error("the template trapped: {0}")]
    Trap(String),
    #[error("the template's reply is {size} bytes; the limit is {limit}")]
    OutputTooLarge { size: usize, limit: usize },
    #[error("the template's reply is malformed: {0}")]
    BadOutput(String),
    #[error("the template refused the request: {0}")]
    Refused(String),
    #[error("all template sandboxes are busy; retry shortly")]
    Busy,
    #[error("template storage: {0}")]
    Storage(String),
    #[error("the module has {found} {what}; the limit is {limit}")]
    TooComplex {
        what: &'static str,
        found: u64,
        limit: u64,
    },
    #[error("compiling the module took longer than {0:?}")]
    CompileTimeout(Duration),
    #[error("the tenant's template storage is full: {0}")]
    QuotaExceeded(String),
}

impl TemplateError {
    /// Machine-readable code for API errors and metrics.
    pub fn code(&self) -> &'static str {
        use TemplateError::*;
        match self {
            NotWasm(_) => "template_not_wasm",
            ModuleTooLarge { .. } => "template_too_large",
            MissingExport { .. } => "template_missing_export",
            ForbiddenImport { .. } => "template_forbidden_import",
            AbiVersion { .. } => "template_abi_version",
            NotFound(_) | NoSuchVersion { .. } => "template_not_found",
            VersionActive { .. } => "template_version_active",
            BadName(_) => "template_bad_name",
            Timeout(_) => "template_timeout",
            OutOfFuel(_) => "template_out_of_fuel",
            OutOfMemory { .. } => "template_out_of_memory",
            Trap(_) => "template_trap",
            OutputTooLarge { .. } => "template_output_too_large",
            BadOutput(_) => "template_bad_output",
            Refused(_) => "template_refused",
            Busy => "template_busy",
            Storage(_) => "template_storage",
            TooComplex { .. } => "template_too_complex",
            CompileTimeout(_) => "template_compile_timeout",
            QuotaExceeded(_) => "template_quota_exceeded",
        }
    }

    /// HTTP status: 400 for a bad upload, 404 unknown, 409 conflict, 422 for a template that
    /// failed on this request (the tenant's code, not the gateway), 503 when the pool is full.
    pub fn status(&self) -> u16 {
        use TemplateError::*;
        match self {
            NotWasm(_)
            | MissingExport { .. }
            | ForbiddenImport { .. }
            | AbiVersion { .. }
            | BadName(_)
            | TooComplex { .. } => 400,
            CompileTimeout(_) => 422,
            QuotaExceeded(_) => 409,
            ModuleTooLarge { .. } => 413,
            NotFound(_) | NoSuchVersion { .. } => 404,
            VersionActive { .. } => 409,
            Timeout(_)
            | OutOfFuel(_)
            | OutOfMemory { .. }
            | Trap(_)
            | OutputTooLarge { .. }
            | BadOutput(_)
            | Refused(_) => 422,
            Busy => 503,
            Storage(_) => 500,
        }
    }
}
