//! The inner service of one request, its types erased once.
//!
//! `Idempotency::call` takes the inner service that was polled ready and wraps it
//! in a [`Handler`]; everything after `call` (the pass-through and keyless paths,
//! the claim, the detached execution) works on that one concrete type instead of
//! repeating the inner service's bounds.

use std::pin::Pin;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use idemgate_core::BoxError;

/// A boxed, `Send` future, as the layer's services return.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The ready inner service for one request: called at most once, answering with
/// an erased body. `E` is the inner service's error, kept as it is so the layer
/// passes it through unchanged on the paths that return it; the detached execution
/// only logs errors and uses `Handler<BoxError>`.
pub(crate) struct Handler<E = BoxError> {
    call: Box<dyn FnOnce(Request<Body>) -> Answer<E> + Send>,
}

/// What calling a [`Handler`] gives: the response to come, or the inner error.
type Answer<E> = BoxFuture<Result<Response<Body>, E>>;

impl<E: Send + 'static> Handler<E> {
    /// Wraps `service`, which must already have been polled ready.
    pub(crate) fn new<S, ResBody>(mut service: S) -> Self
    where
        S: Service<Request<Body>, Response = Response<ResBody>, Error = E> + Send + 'static,
        S::Future: Send + 'static,
        ResBody: http_body::Body<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<BoxError>,
    {
        Self {
            call: Box::new(move |request| {
                let response = service.call(request);
                Box::pin(async move { Ok(response.await?.map(Body::new)) })
            }),
        }
    }

    /// Runs the handler on `request`. The inner service is called when the
    /// returned future is first polled, so a panic in it is caught wherever that
    /// future is.
    pub(crate) async fn call(self, request: Request<Body>) -> Result<Response<Body>, E> {
        (self.call)(request).await
    }

    /// The same handler, its error boxed: for the detached execution, which logs
    /// errors and never returns them.
    pub(crate) fn boxing_errors(self) -> Handler
    where
        E: Into<BoxError>,
    {
        Handler {
            call: Box::new(move |request| {
                let response = (self.call)(request);
                Box::pin(async move { response.await.map_err(Into::into) })
            }),
        }
    }
}
