//! Who a request is: the bearer token it came with, checked against the API's token and the
//! operators' named tokens (`[[server.operator]]`), each in constant time. The request carries
//! the answer ([`Caller`]) to the handlers that log it, such as an operator's terminal.

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, ErrorCode, Shared};

/// Whose token a request came with, for the handlers that log it (an operator's terminal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The API token (`server.token`), or none where the API is open.
    Api,
    /// An operator's named token (`[[server.operator]]`).
    Operator(String),
}

/// Who `given` (a bearer token) is: the API's token, an operator's, or nobody. Every token is
/// compared, in constant time, so the time taken does not say which one nearly matched.
fn caller(state: &AppState, given: &[u8]) -> Option<Caller> {
    let api = state.token.as_ref().is_some_and(|t| t.matches(given));
    let mut operator = None;
    for (name, token) in &state.operators {
        if token.matches(given) {
            operator = Some(name);
        }
    }
    match (api, operator) {
        (true, _) => Some(Caller::Api),
        (false, Some(name)) => Some(Caller::Operator(name.clone())),
        (false, None) => None,
    }
}

pub(super) async fn auth(
    State(state): State<Shared>,
    headers: HeaderMap,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let who = if state.token.is_some() {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        match caller(&state, given.as_bytes()) {
            Some(who) => who,
            None => {
                return ApiError::new(ErrorCode::Unauthorized, "missing or invalid bearer token")
                    .into_response();
            }
        }
    } else {
        Caller::Api
    };
    request.extensions_mut().insert(who);
    if let Some(connection) = request.extensions().get::<crate::serve::Connection>() {
        connection.authenticated();
    }
    next.run(request).await
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use flotilla_credentials::Secret;
    use tower::ServiceExt;

    use super::*;

    fn state() -> AppState {
        AppState {
            pools: crate::pools::Pools::running([]),
            token: Some(Secret::new("the-api-token".to_string())),
            sd_token: None,
            operators: vec![
                ("alice".to_string(), Secret::new("alice-token".to_string())),
                ("bob".to_string(), Secret::new("bob-token".to_string())),
            ],
            metrics: crate::metrics::Metrics::new().expect("metrics"),
            draining: std::sync::atomic::AtomicBool::new(false),
        }
    }

    #[test]
    fn a_token_names_its_caller_and_no_other() {
        let state = state();
        assert_eq!(caller(&state, b"the-api-token"), Some(Caller::Api));
        assert_eq!(
            caller(&state, b"alice-token"),
            Some(Caller::Operator("alice".into()))
        );
        assert_eq!(
            caller(&state, b"bob-token"),
            Some(Caller::Operator("bob".into()))
        );
        for wrong in [
            &b""[..],
            b"alice",
            b"alice-token ",
            b"ALICE-TOKEN",
            b"the-api-token\n",
        ] {
            assert_eq!(caller(&state, wrong), None, "{wrong:?}");
        }
    }

    /// The lease API takes the API token and each operator's token, and nothing else.
    #[tokio::test]
    async fn the_api_takes_an_operators_token_and_refuses_others() {
        let app = super::super::router(Arc::new(state()));
        let ask = |token: &str| {
            let request = axum::http::Request::get("/v1/pools")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .body(axum::body::Body::empty())
                .expect("a request");
            app.clone().oneshot(request)
        };
        for (token, want) in [
            ("the-api-token", StatusCode::OK),
            ("alice-token", StatusCode::OK),
            ("bob-token", StatusCode::OK),
            ("carol-token", StatusCode::UNAUTHORIZED),
            ("", StatusCode::UNAUTHORIZED),
        ] {
            let answer = ask(token).await.expect("an answer");
            assert_eq!(answer.status(), want, "{token:?}");
        }
    }
}
