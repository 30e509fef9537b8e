//! What a listener serves.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{Request, Response};
use tower::Service;

/// A service that answers every request a listener reads: an axum `Router`,
/// or any service of its shape. It is cloned for each request (a router's
/// clone is one reference count), and its futures may move between threads.
///
/// A router is what an application with routes of its own serves; a service
/// that owns every path (the proxy's dispatcher) is served as it is, without
/// a router's matching, boxing and extensions in front of it on every request.
pub trait HttpService:
    Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S where
    S: Service<
            Request<Body>,
            Response = Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}
