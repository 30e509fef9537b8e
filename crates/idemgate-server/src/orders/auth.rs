//! Bearer authentication for the orders API, outside the idempotency layer: a
//! request that fails it never reaches a claim.

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idemgate::ProblemDetails;

use crate::principal::bearer_principal;

/// `Authorization: Bearer <token>`: the token names the principal; only its
/// SHA-256 is kept. Missing or empty → 401, two `Authorization` lines → 400
/// `ambiguous-header`, both before the idempotency layer.
pub async fn authenticate(mut request: Request, next: Next) -> Response {
    let mut lines = request.headers().get_all(header::AUTHORIZATION).iter();
    let (first, second) = (lines.next(), lines.next());
    if second.is_some() {
        // Which credentials are meant is ambiguous: refused before any claim.
        return ProblemDetails::ambiguous_header(&header::AUTHORIZATION).into_response();
    }
    let token = first
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|token| !token.is_empty());
    let Some(token) = token else {
        return ProblemDetails::unauthenticated("send Authorization: Bearer <token>")
            .into_response();
    };
    let principal = bearer_principal(token);
    request.extensions_mut().insert(principal);
    next.run(request).await
}
