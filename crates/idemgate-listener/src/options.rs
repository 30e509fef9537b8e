//! The limits of one listener, and the base of its refusals' problem types.

use std::sync::Arc;
use std::time::Duration;

/// The limits of one listener, checked (see the crate docs for what each bounds),
/// and how its own refusals name their problem types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerOptions {
    /// From accept, or from a request's first byte, to the end of its head.
    pub header_read_timeout: Duration,
    /// From the end of the head to the end of the body.
    pub body_read_timeout: Duration,
    /// A keep-alive connection's wait for its next request.
    pub idle_timeout: Duration,
    /// Connections open at once, before the file-descriptor cap.
    pub max_connections: usize,
    /// What the `type` URI of each of the listener's own refusals (`503
    /// connection-limit`, `408 body-timeout`) starts with, before the slug: the
    /// operator's base, so that these answers name their types like every other
    /// problem the server sends (`docs/problems.md`). Default `/problems/`.
    pub problem_type_base: Arc<str>,
}

/// The problem type base when the operator sets none: a relative reference,
/// resolved against the server that answered (`docs/problems.md`, "The base").
const DEFAULT_PROBLEM_TYPE_BASE: &str = "/problems/";

impl ListenerOptions {
    /// These options with the refusals' problem types under `base` (the same
    /// base the application's problems use, `--problem-type-base`).
    ///
    /// ```
    /// use idemgate_listener::ListenerOptions;
    ///
    /// let options = ListenerOptions::default().with_problem_type_base("https://docs.example.com/errors/");
    /// assert_eq!(&*options.problem_type_base, "https://docs.example.com/errors/");
    /// ```
    #[must_use]
    pub fn with_problem_type_base(mut self, base: impl Into<Arc<str>>) -> Self {
        self.problem_type_base = base.into();
        self
    }
}

impl Default for ListenerOptions {
    /// The flags' defaults: 10 s head, 30 s body, 75 s idle, 10 000 connections;
    /// problem types under `/problems/`.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            max_connections: 10_000,
            problem_type_base: Arc::from(DEFAULT_PROBLEM_TYPE_BASE),
        }
    }
}
