//! API errors in OpenAI's JSON shape, with the HTTP status and (for overload) `Retry-After`.

use std::time::Duration;

use hyper::StatusCode;

use crate::sandbox::TemplateError;
use crate::tenants::Denied;

/// Where an error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Client,
    Upstream,
    Internal,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `error.type`.
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub message: String,
    pub param: Option<&'static str>,
    pub retry_after: Option<Duration>,
    pub source: Source,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: None,
            message: message.into(),
            param,
            retry_after: None,
            source: Source::Client,
        }
    }
    pub fn not_found(message: impl Into<String>, code: &'static str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some(code),
            ..Self::bad_request(message, None)
        }
    }
    pub fn overloaded(message: impl Into<String>, retry_after: Duration) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            code: Some("overloaded"),
            message: message.into(),
            param: None,
            retry_after: Some(retry_after),
            source: Source::Upstream,
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            code: None,
            message: message.into(),
            param: None,
            retry_after: None,
            source: Source::Internal,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> Self {
        let message = d.to_string();
        match d {
            Denied::BadKey => ApiError {
                status: StatusCode::UNAUTHORIZED,
                code: Some("invalid_api_key"),
                ..ApiError::bad_request(
                    "Incorrect API key provided. Send it as `Authorization: Bearer <key>`.",
                    None,
                )
            },
            Denied::ModelNotAllowed { .. } => ApiError {
                status: StatusCode::FORBIDDEN,
                code: Some("model_not_allowed"),
                ..ApiError::bad_request(message, Some("model"))
            },
            Denied::RateLimited { retry_after, .. } => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                kind: "rate_limit_error",
                code: Some("rate_limit_exceeded"),
                message,
                param: None,
                retry_after: Some(retry_after),
                source: Source::Client,
            },
            Denied::TooLarge { .. } => ApiError {
                code: Some("request_too_large"),
                ..ApiError::bad_request(message, None)
            },
        }
    }
}

impl From<TemplateError> for ApiError {
    fn from(e: TemplateError) -> Self {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError {
            status,
            kind: match e.status() {
                422 => "template_error",
                503 => "server_error",
                500 => "server_error",
                _ => "invalid_request_error",
            },
            code: Some(e.code()),
            message: e.to_string(),
            param: None,
            retry_after: matches!(e, TemplateError::Busy).then(|| Duration::from_secs(1)),
            source: if e.status() >= 500 {
                Source::Internal
            } else {
                Source::Client
            },
        }
    }
}
