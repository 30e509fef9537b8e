//! The two bodies a forwarded exchange streams: the upstream's response, bounded
//! in time, and the client's request, watched so that its failure is told from
//! the upstream's.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use idemgate::BoxError;
use tokio::time::{Instant, Sleep};

use crate::problem;

/// An upstream response body that may neither pause longer than `idle` between
/// frames nor end later than `deadline`.
///
/// On expiry it fails with a `504 upstream-timeout` [`idemgate::ProblemDetails`]
/// and drops the upstream body at once, so the pooled connection is closed
/// rather than reused mid-response. What the client then sees depends on where
/// the body goes: the layer, still buffering a covered response for its record,
/// answers that 504 and settles it by the route's `server_errors`; a streamed
/// response (uncovered, or past the stored-response limit) has its head out
/// already, so the client's connection is cut and its body ends short.
pub(crate) struct UpstreamBody<B> {
    inner: Option<B>,
    idle: Duration,
    idle_timer: Pin<Box<Sleep>>,
    deadline: Option<(Duration, Pin<Box<Sleep>>)>,
}

impl<B> UpstreamBody<B> {
    /// Bounds `inner`: `idle` from now to the first frame and between frames;
    /// `deadline` (its length, and the instant it ends) for the whole response.
    pub(crate) fn new(inner: B, idle: Duration, deadline: Option<(Duration, Instant)>) -> Self {
        Self {
            inner: Some(inner),
            idle,
            idle_timer: Box::pin(tokio::time::sleep(idle)),
            deadline: deadline.map(|(length, at)| (length, Box::pin(tokio::time::sleep_until(at)))),
        }
    }
}

impl<B> http_body::Body for UpstreamBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some((length, timer)) = &mut this.deadline
            && timer.as_mut().poll(cx).is_ready()
        {
            let length = *length;
            this.inner = None;
            return Poll::Ready(Some(Err(Box::new(problem::upstream_deadline(length)))));
        }
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(frame)) => {
                this.idle_timer.as_mut().reset(Instant::now() + this.idle);
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Ready(None) => {
                this.inner = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                ready!(this.idle_timer.as_mut().poll(cx));
                this.inner = None;
                Poll::Ready(Some(Err(Box::new(problem::upstream_stalled(this.idle)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), http_body::Body::size_hint)
    }
}

/// The client's request body on its way upstream, raising `failed` if reading
/// it fails — bad chunked framing, a client gone mid-upload — so that the
/// broken exchange is answered as the client's fault (`400`), not the
/// upstream's (`502`).
pub(crate) struct ClientBody {
    inner: Body,
    failed: Arc<AtomicBool>,
}

impl ClientBody {
    /// Watches `inner`; `failed` turns true when it errors.
    pub(crate) fn new(inner: Body, failed: Arc<AtomicBool>) -> Self {
        Self { inner, failed }
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if matches!(frame, Some(Err(_))) {
            self.failed.store(true, Ordering::SeqCst);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// One frame every `every` (`None`: one frame, then nothing ever again).
    struct Trickle {
        every: Option<Duration>,
        next: Option<Pin<Box<Sleep>>>,
        sent: usize,
    }

    impl http_body::Body for Trickle {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if self.sent > 0 {
                let Some(every) = self.every else {
                    return Poll::Pending;
                };
                let timer = self
                    .next
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
                ready!(timer.as_mut().poll(cx));
                self.next = None;
            }
            self.sent += 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }
    }

    fn trickle(every: Option<Duration>) -> Trickle {
        Trickle {
            every,
            next: None,
            sent: 0,
        }
    }

    async fn failure(
        body: impl http_body::Body<Error = BoxError>,
    ) -> (usize, idemgate::ProblemDetails) {
        let mut body = std::pin::pin!(body);
        let mut frames = 0;
        loop {
            match body.frame().await {
                Some(Ok(_)) => frames += 1,
                Some(Err(error)) => {
                    let problem = error
                        .downcast_ref::<idemgate::ProblemDetails>()
                        .expect("a problem")
                        .clone();
                    assert!(body.frame().await.is_none(), "over after the failure");
                    return (frames, problem);
                }
                None => panic!("the body ended instead of failing"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_between_frames_fails_with_a_504_problem() {
        let idle = Duration::from_millis(300);
        let (frames, problem) = failure(UpstreamBody::new(trickle(None), idle, None)).await;
        assert_eq!(frames, 1);
        assert_eq!(problem.status, 504);
        assert!(problem.detail.contains("300 ms"), "{}", problem.detail);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_under_the_idle_bound_is_cut_by_the_deadline() {
        let idle = Duration::from_millis(300);
        let deadline = Duration::from_secs(2);
        let body = UpstreamBody::new(
            trickle(Some(Duration::from_millis(100))),
            idle,
            Some((deadline, Instant::now() + deadline)),
        );
        let (frames, problem) = failure(body).await;
        assert!((15..=21).contains(&frames), "{frames} frames in 2 s");
        assert_eq!(problem.status, 504);
        assert!(problem.detail.contains("2000 ms"), "{}", problem.detail);
    }
}
