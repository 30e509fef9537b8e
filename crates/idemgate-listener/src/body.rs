//! The request body under its total deadline (the 408 past it is a
//! refusal, rendered in `refusal`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

/// The request body did not arrive within the body-read timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body-read timeout")]
pub struct BodyReadTimeout;

/// A request body with a total deadline; past it, an error and a flag the request
/// sees to answer 408.
pub(crate) struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    /// Armed at the first wait, so a body that is already here costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl DeadlineBody {
    /// `inner`, which must arrive whole by `deadline`; past it `timed_out` is set.
    pub(crate) fn new(inner: Incoming, deadline: Instant, timed_out: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            deadline,
            sleep: None,
            timed_out,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(Box::new(BodyReadTimeout))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
