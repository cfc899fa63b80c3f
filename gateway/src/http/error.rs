//! Errors at the HTTP edge: the status, OpenAI's JSON error shape (`message`, `type`, `param`,
//! `code`), where the error comes from, and `Retry-After` for overload. Subsystems' errors map
//! into it where the server meets them (`server::errors`).

use std::time::Duration;

use hyper::{header, Response, StatusCode};

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
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<std::borrow::Cow<'static, str>>,
    pub retry_after: Option<Duration>,
    pub source: Source,
    /// More headers for the response (a refused tenant's `x-ratelimit-*`).
    pub headers: Box<[(&'static str, String)]>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: None,
            message: message.into(),
            param: param.map(std::borrow::Cow::Borrowed),
            retry_after: None,
            source: Source::Client,
            headers: Box::default(),
        }
    }
    /// A 400 naming a field known only at run time (`messages[2].content`, an unknown key).
    pub fn bad_field(message: impl Into<String>, param: impl Into<String>) -> Self {
        ApiError {
            param: Some(std::borrow::Cow::Owned(param.into())),
            ..Self::bad_request(message, None)
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
            headers: Box::default(),
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
            headers: Box::default(),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// The error as a response: its status, its JSON body, `Retry-After` (whole seconds, at
    /// least one) when the client should retry, and its other headers.
    pub fn response(&self) -> Response<super::Body> {
        let mut r = super::json(self.status, &self.body());
        if let Some(d) = self.retry_after {
            let secs = d.as_secs_f64().ceil().max(1.0) as u64;
            r.headers_mut().insert(header::RETRY_AFTER, secs.into());
        }
        super::add_headers(&mut r, &self.headers);
        r
    }

    /// Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`, the type by
    /// status as Anthropic names them.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self.status.as_u16() {
            400 | 405 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            408 => "timeout_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        };
        // Anthropic's clients send the key as `x-api-key`: say so.
        let mut message = if self.code == Some("invalid_api_key") {
            "Incorrect API key provided. Send it as `x-api-key: <key>` (or `Authorization: Bearer <key>`).".to_string()
        } else {
            self.message.clone()
        };
        if let Some(p) = &self.param {
            if !message.contains(p.as_ref()) {
                message = format!("{p}: {message}");
            }
        }
        serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    /// [`ApiError::response`] in Anthropic's shape.
    pub fn anthropic_response(&self) -> Response<super::Body> {
        let mut r = self.response();
        let b = super::json(self.status, &self.anthropic_body());
        *r.body_mut() = b.into_body();
        r
    }

    /// 405 for a route that exists with other methods.
    pub fn method_not_allowed(method: &hyper::Method, path: &str) -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: Some("method_not_allowed"),
            ..ApiError::bad_request(format!("{method} is not allowed on {path}"), None)
        }
    }
}
