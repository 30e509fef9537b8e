//! A `BEGIN` that may be given up on, but is never cut in half.
//!
//! sqlx counts a connection's transaction depth only once the server has
//! answered its `BEGIN`. A `pool.begin()` future dropped after it sent `BEGIN`
//! and before the answer (a deadline ran out: a frozen or slow server) leaves
//! the connection inside the transaction the server opened, with a depth of
//! zero, so nothing rolls it back: sqlx pings it and pools it, and the next
//! statements on that connection — a claim, another request's writes — would
//! run in a transaction nobody commits.
//!
//! [`BeginToTheEnd`] wraps the begin. Polled to the end, it is the begin. Dropped
//! before that, it finishes the begin in a task of its own and drops the
//! transaction it gets, which rolls it back before the connection is pooled.
//! Wrap it in any deadline.

use std::pin::Pin;
use std::task::{Context, Poll};

use sqlx::{Database, Pool, Transaction};

type Begin<DB> =
    Pin<Box<dyn Future<Output = Result<Transaction<'static, DB>, sqlx::Error>> + Send>>;

/// A checkout and its `BEGIN` on a pool ([`begin_to_the_end`]), safe to give
/// up on.
///
/// sqlx counts a transaction only once the server has answered its `BEGIN`; a
/// `pool.begin()` dropped in between leaves the connection inside the
/// transaction the server opened, and sqlx pools it that way. Polled to the end,
/// this is the begin; dropped before that, it finishes the begin in a task of
/// its own and drops the transaction it gets, which rolls it back before the
/// connection is pooled.
#[must_use = "a begin does nothing unless awaited"]
pub struct BeginToTheEnd<DB: Database> {
    /// `Some` until it answered.
    begin: Option<Begin<DB>>,
}

/// `pool.begin()`, or `pool.begin_with(statement)`, safe to give up on (any
/// deadline may wrap it): see [`BeginToTheEnd`].
pub fn begin_to_the_end<DB: Database>(
    pool: &Pool<DB>,
    statement: Option<String>,
) -> BeginToTheEnd<DB> {
    let pool = pool.clone();
    let begin: Begin<DB> = match statement {
        None => Box::pin(async move { pool.begin().await }),
        Some(statement) => {
            Box::pin(async move { pool.begin_with(sqlx::AssertSqlSafe(statement)).await })
        }
    };
    BeginToTheEnd { begin: Some(begin) }
}

impl<DB: Database> std::fmt::Debug for BeginToTheEnd<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeginToTheEnd")
            .field("answered", &self.begin.is_none())
            .finish()
    }
}

impl<DB: Database> Future for BeginToTheEnd<DB> {
    type Output = Result<Transaction<'static, DB>, sqlx::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let begin = self
            .begin
            .as_mut()
            .expect("BeginToTheEnd polled after it answered");
        let answer = std::task::ready!(begin.as_mut().poll(cx));
        self.begin = None;
        Poll::Ready(answer)
    }
}

impl<DB: Database> Drop for BeginToTheEnd<DB> {
    fn drop(&mut self) {
        let Some(begin) = self.begin.take() else {
            return;
        };
        // Outside a runtime (one shutting down) nothing can finish it; the
        // connection then goes with the pool.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Dropping the transaction it gets rolls it back.
            runtime.spawn(async move { drop(begin.await) });
        }
    }
}
