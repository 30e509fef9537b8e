//! Property tests of problem+json rendering (RFC 9457): whatever a detail holds and
//! whatever `Retry-After` is asked for, the response is well-formed JSON that says
//! exactly what was given, with the status on the line and in the body.

use std::time::Duration;

use axum::response::IntoResponse;
use http::StatusCode;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http_body_util::BodyExt;
use idemgate::ProblemDetails;
use proptest::prelude::*;

fn render(problem: ProblemDetails) -> (http::response::Parts, serde_json::Value) {
    let (parts, body) = problem.into_response().into_parts();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bytes = runtime.block_on(body.collect()).unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).expect("the body is JSON");
    (parts, json)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_problem_renders_as_what_it_says(
        status in 400u16..=599,
        slug in "[a-z][a-z0-9-]{0,30}",
        title in prop::sample::select(vec!["Bad request", "Ünïcode \"title\"", "", "a\nb"]),
        detail in any::<String>(),
        retry_after_ms in prop::option::of(any::<u64>()),
    ) {
        let status = StatusCode::from_u16(status).unwrap();
        let mut problem = ProblemDetails::new(status, &slug, title, detail.clone());
        if let Some(ms) = retry_after_ms {
            problem = problem.with_retry_after(Duration::from_millis(ms));
        }
        let (parts, json) = render(problem);
        prop_assert_eq!(parts.status, status);
        prop_assert_eq!(&parts.headers[CONTENT_TYPE], "application/problem+json");
        let type_uri = format!("/problems/{slug}");
        prop_assert_eq!(json["type"].as_str(), Some(type_uri.as_str()));
        prop_assert_eq!(json["title"].as_str(), Some(title));
        prop_assert_eq!(json["status"].as_u64(), Some(u64::from(status.as_u16())));
        prop_assert_eq!(json["detail"].as_str(), Some(detail.as_str()));
        match retry_after_ms {
            None => prop_assert!(parts.headers.get(RETRY_AFTER).is_none()),
            Some(ms) => {
                let seconds: u64 = parts.headers[RETRY_AFTER].to_str().unwrap().parse().unwrap();
                // Whole seconds, rounded up, at least one: a client never retries early.
                prop_assert!(seconds >= 1);
                prop_assert!(seconds.saturating_mul(1000) >= ms.min(u64::MAX / 1000 * 1000));
                prop_assert!(seconds <= (ms / 1000).saturating_add(1).max(1));
            }
        }
    }
}
