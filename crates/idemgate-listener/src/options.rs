//! The limits of one listener.

use std::time::Duration;

/// The limits of one listener, checked (see the crate docs for what each bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerOptions {
    /// From accept, or from a request's first byte, to the end of its head.
    pub header_read_timeout: Duration,
    /// From the end of the head to the end of the body.
    pub body_read_timeout: Duration,
    /// A keep-alive connection's wait for its next request.
    pub idle_timeout: Duration,
    /// Connections open at once, before the file-descriptor cap.
    pub max_connections: usize,
}

impl Default for ListenerOptions {
    /// The flags' defaults: 10 s head, 30 s body, 75 s idle, 10 000 connections.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            max_connections: 10_000,
        }
    }
}
