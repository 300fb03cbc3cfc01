//! Errors as the OpenAI API writes them: a status and `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::Error;

/// A failed request.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for people.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: &'static str,
}

impl ApiError {
    /// A 400 about the request.
    pub fn invalid(message: impl Into<String>, param: Option<&str>, code: &'static str) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: param.map(str::to_string), code }
    }

    /// Another status.
    pub fn with_status(status: StatusCode, message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { status, message: message.into(), param: None, code }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl From<Error> for ApiError {
    /// The engine's errors: what the request caused is a 400, the rest a 500.
    fn from(e: Error) -> ApiError {
        let code = match &e {
            Error::ContextOverflow { .. } => "context_length_exceeded",
            Error::EmptyPrompt => "empty_prompt",
            Error::TokenOutOfRange { .. } => "invalid_token",
            Error::ChatTemplate(_) => "chat_template_error",
            Error::NoChatTemplate(_) => "no_chat_template",
            Error::Tokenizer(_) => "tokenizer_error",
            Error::InvalidArgument(_) => "invalid_value",
            _ => return ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "server_error"),
        };
        ApiError::invalid(e.to_string(), None, code)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}});
        (self.status, axum::Json(body)).into_response()
    }
}
