//! `GET /demo/checkout`: a checkout page that places orders through the
//! JavaScript client (`clients/js`) with one `Idempotency-Key` per purchase, and
//! shows each attempt — key digest, status, replayed or not — as it happens.
//!
//! Everything the browser loads is embedded in the binary from `src/demo/`: the
//! page, its script and style, and the client's ES modules. Those are generated:
//! `npm run embed` in `clients/js` copies its build here, and the JS suite fails
//! while the copy differs from a fresh build, so `cargo build` needs no npm. No
//! CDN: the page's Content-Security-Policy allows its own origin only.
//!
//! The page is outside the bearer authentication and the idempotency layer; it
//! calls the orders API like any client, as a demo principal of its own: a random
//! bearer token made per browser tab and kept in its `sessionStorage` (the orders
//! service takes any bearer token as a principal).

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const HTML: &str = "text/html; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Own origin only: scripts, styles and `fetch` (the orders API); no inline code,
/// no plugins (`object-src 'none'`: `default-src` alone would allow same-origin
/// `<object>`/`<embed>`), no frames, no form posts elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; object-src 'none'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file and the path it is served at.
#[derive(Debug)]
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

macro_rules! asset {
    ($path:literal, $content_type:expr, $file:literal) => {
        Asset {
            path: $path,
            content_type: $content_type,
            body: include_str!($file),
        }
    };
}

/// Every file under `src/demo/` (a test holds the two lists equal).
const ASSETS: &[Asset] = &[
    asset!("/demo/checkout", HTML, "demo/checkout.html"),
    asset!("/demo/checkout/checkout.js", JAVASCRIPT, "demo/checkout.js"),
    asset!("/demo/checkout/checkout.css", CSS, "demo/checkout.css"),
    asset!(
        "/demo/checkout/idemgate-client/index.js",
        JAVASCRIPT,
        "demo/idemgate-client/index.js"
    ),
    asset!(
        "/demo/checkout/idemgate-client/client.js",
        JAVASCRIPT,
        "demo/idemgate-client/client.js"
    ),
    asset!(
        "/demo/checkout/idemgate-client/errors.js",
        JAVASCRIPT,
        "demo/idemgate-client/errors.js"
    ),
    asset!(
        "/demo/checkout/idemgate-client/event-stream.js",
        JAVASCRIPT,
        "demo/idemgate-client/event-stream.js"
    ),
    asset!(
        "/demo/checkout/idemgate-client/events.js",
        JAVASCRIPT,
        "demo/idemgate-client/events.js"
    ),
    asset!(
        "/demo/checkout/idemgate-client/operation.js",
        JAVASCRIPT,
        "demo/idemgate-client/operation.js"
    ),
    asset!(
        "/demo/checkout/idemgate-client/policy.js",
        JAVASCRIPT,
        "demo/idemgate-client/policy.js"
    ),
];

/// The page's routes, for any router state: merge them outside the
/// authentication and idempotency layers.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        router.route(asset.path, get(move || async move { serve(asset) }))
    })
}

fn serve(asset: &'static Asset) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            // The binary is the version: revalidate, so a new binary's page is seen.
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        ],
        asset.body,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn get(path: &str) -> (StatusCode, Option<String>, String) {
        let response = routes::<()>()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        if response.status() == StatusCode::OK {
            assert_csp(path, response.headers());
        }
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    /// Every asset carries the policy, and the policy says what it must.
    fn assert_csp(path: &str, headers: &axum::http::HeaderMap) {
        let csp = headers
            .get(header::CONTENT_SECURITY_POLICY)
            .unwrap_or_else(|| panic!("{path} has no Content-Security-Policy"))
            .to_str()
            .unwrap();
        let directives: BTreeSet<&str> = csp.split(';').map(str::trim).collect();
        for wanted in [
            "default-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ] {
            assert!(
                directives.contains(wanted),
                "{path}: {wanted} missing from {csp}"
            );
        }
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval") && !csp.contains('*'),
            "{path}: {csp}"
        );
        assert_eq!(
            headers.get(header::X_CONTENT_TYPE_OPTIONS).unwrap(),
            "nosniff"
        );
    }

    #[test]
    fn the_client_modules_are_marked_generated() {
        for asset in ASSETS
            .iter()
            .filter(|asset| asset.path.contains("/idemgate-client/"))
        {
            assert!(
                asset.body.starts_with("// GENERATED FILE: do not edit."),
                "{} has no generated banner: run `npm run embed` in clients/js",
                asset.path
            );
        }
    }

    #[tokio::test]
    async fn every_asset_is_served_with_its_type() {
        for asset in ASSETS {
            let (status, content_type, body) = get(asset.path).await;
            assert_eq!(status, StatusCode::OK, "{}", asset.path);
            assert_eq!(content_type.as_deref(), Some(asset.content_type));
            assert_eq!(body, asset.body);
        }
        let (status, ..) = get("/demo/checkout/missing.js").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn every_file_of_the_demo_folder_is_embedded() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/demo");
        let mut on_disk = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                for inner in std::fs::read_dir(&path).unwrap() {
                    on_disk.insert(inner.unwrap().path());
                }
            } else {
                on_disk.insert(path);
            }
        }
        let embedded: BTreeSet<_> = ASSETS
            .iter()
            .map(|asset| {
                let file = asset.path.strip_prefix("/demo/checkout").unwrap();
                match file {
                    "" => dir.join("checkout.html"),
                    file => dir.join(file.trim_start_matches('/')),
                }
            })
            .collect();
        assert_eq!(on_disk, embedded, "src/demo/ and ASSETS disagree");
    }

    #[test]
    fn the_page_loads_only_embedded_files() {
        let served: BTreeSet<&str> = ASSETS.iter().map(|asset| asset.path).collect();
        let page = ASSETS[0].body;
        for attribute in ["src=\"", "href=\""] {
            for reference in page.split(attribute).skip(1) {
                let target = reference.split('"').next().unwrap();
                if target.starts_with("data:") {
                    continue;
                }
                assert!(served.contains(target), "the page loads {target}");
            }
        }
        for asset in ASSETS.iter().filter(|a| a.content_type == JAVASCRIPT) {
            let base = asset.path.rsplit_once('/').unwrap().0;
            for import in asset.body.split(" from \"./").skip(1) {
                let target = format!("{base}/{}", import.split('"').next().unwrap());
                assert!(
                    served.contains(target.as_str()),
                    "{} imports {target}",
                    asset.path
                );
            }
        }
    }
}
