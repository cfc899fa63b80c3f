//! Where the server meets its subsystems' errors: each maps to an [`ApiError`] with the right
//! status, OpenAI `type` and `code`.

use std::time::Duration;

use cachet_backend::EngineError;
use hyper::StatusCode;

use crate::http::error::{ApiError, Source};
use crate::sandbox::TemplateError;
use crate::tenants::Denied;
use crate::upstream::UpstreamError;

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
            Denied::Suspended { .. } => ApiError {
                status: StatusCode::FORBIDDEN,
                kind: "permission_error",
                code: Some("tenant_suspended"),
                ..ApiError::bad_request(message, None)
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
                headers: Box::default(),
            },
            Denied::OverBudget { retry_after, .. } => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                kind: "insufficient_quota",
                code: Some("budget_exceeded"),
                message,
                param: None,
                retry_after: Some(retry_after),
                source: Source::Client,
                headers: Box::default(),
            },
            Denied::LimitsUnavailable { .. } => ApiError {
                code: Some("rate_limits_unavailable"),
                ..ApiError::overloaded(message, std::time::Duration::from_secs(1))
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
            headers: Box::default(),
        }
    }
}

impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> Self {
        match e {
            UpstreamError::Rejected { .. } => ApiError {
                code: Some("upstream_rejected"),
                ..ApiError::bad_request(e.to_string(), None)
            },
            UpstreamError::InvalidRequest(m) => ApiError::bad_request(m, None),
            other => ApiError::overloaded(other.to_string(), Duration::from_secs(1)),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            e if e.is_overload() => ApiError::overloaded(e.to_string(), Duration::from_secs(1)),
            EngineError::InvalidRequest(m) => ApiError::bad_request(m, None),
            e @ EngineError::Template(_) => {
                tracing::error!(error = %e, "chat template");
                ApiError {
                    code: Some("chat_template_error"),
                    ..ApiError::internal(e.to_string())
                }
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}
