//! A serving process's life, the same for `serve` and `proxy`: why it could not
//! start, binding its listeners, serving until SIGINT or SIGTERM, the graceful
//! drain, and the exit code it ends with.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use idemgate::DetachedTasks;
use idemgate_listener::{HttpService, Listener, ListenerOptions, Workers};

use crate::config::{ConfigError, TelemetrySettings};
use crate::store::OpenError;
use crate::telemetry;

/// The exit code of a command line that cannot work (a [`ConfigError`]).
pub const EXIT_CONFIG: u8 = 2;

/// Why a serving subcommand could not start (or stopped serving).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The orders database is unreachable or refused its migration.
    #[error("orders database: {0}")]
    Database(#[from] sqlx::Error),
    /// The idempotency store could not be opened.
    #[error("{}: {source}", source.what())]
    Store {
        /// What failed opening it.
        #[from]
        source: OpenError,
    },
    /// The payment gateway client could not be built.
    #[error("payment gateway client: {0}")]
    PaymentGateway(#[from] reqwest::Error),
    /// The listen address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP server failed.
    #[error("server: {0}")]
    Serve(std::io::Error),
    /// The journal (`--audit on`) could not read its store's secret: the store
    /// lacks the journal's tables (migrate it) or does not answer.
    #[error("the journal (--audit): {0}")]
    Journal(#[source] idemgate::StoreError),
}

/// Binds a listener, naming the address when it cannot.
pub async fn bind(
    addr: std::net::SocketAddr,
    options: ListenerOptions,
) -> Result<Listener, StartupError> {
    Listener::bind(addr, options)
        .await
        .map_err(|source| StartupError::Listen { addr, source })
}

/// One listener and what it serves, and where: a router on the process's
/// runtime, or `W` (the proxy serves its dispatcher bare) on worker threads.
#[derive(Debug)]
pub enum Served<W = Router> {
    /// On the process's runtime.
    Here(Listener, Router),
    /// On worker threads, one per listener of a group
    /// (`Listener::bind_group`), each on its own runtime.
    OnWorkers(Vec<Listener>, W),
}

/// Serves every listener until SIGINT or SIGTERM, then shuts down gracefully:
/// stop accepting, let open requests finish, wait for detached handlers to store
/// their results, all within `shutdown_timeout`. Worker threads keep running
/// until then (the handlers they spawned run on them), and stop last.
pub async fn serve_until_signal<W: HttpService>(
    servers: Vec<Served<W>>,
    tasks: DetachedTasks,
    shutdown_timeout: Duration,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut here = Vec::new();
    let mut workers = Vec::new();
    for served in servers {
        match served {
            Served::Here(listener, router) => {
                let mut stop_rx = stop_rx.clone();
                here.push(tokio::spawn(async move {
                    listener
                        .serve(router, async move {
                            let _ = stop_rx.wait_for(|stop| *stop).await;
                        })
                        .await;
                }));
            }
            Served::OnWorkers(listeners, service) => {
                match Workers::start(listeners, service, stop_rx.clone()) {
                    Ok(started) => workers.push(started),
                    Err(error) => {
                        tracing::error!(%error, "cannot start the worker threads");
                        let _ = stop_tx.send(true);
                    }
                }
            }
        }
    }
    if !*stop_rx.borrow() {
        shutdown_signal().await;
    }
    tracing::info!(deadline = ?shutdown_timeout, "shutting down: no new connections; finishing in-flight requests");
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now() + shutdown_timeout;
    for server in here {
        match tokio::time::timeout_at(deadline, server).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "server task failed"),
            Err(_) => tracing::warn!("open connections did not finish before the deadline"),
        }
    }
    for group in &mut workers {
        if tokio::time::timeout_at(deadline, group.drained())
            .await
            .is_err()
        {
            tracing::warn!("open connections did not finish before the deadline");
        }
    }
    let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
    if tasks.shutdown(remaining).await {
        tracing::info!("all in-flight requests finished and stored their results");
    } else {
        tracing::warn!(
            running = tasks.running(),
            "shutdown deadline passed with handlers still running; their records stay PROCESSING and are taken over after the lease"
        );
    }
    for group in workers {
        group.release().await;
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// Runs a serving subcommand to its exit code: starts logging (and OTLP export,
/// if asked), runs `service` (a future does nothing until awaited, so it starts
/// after), then flushes the exporter. A start that failed is logged and printed.
pub async fn run_service(
    telemetry: TelemetrySettings,
    service: impl Future<Output = Result<(), StartupError>>,
) -> ExitCode {
    let telemetry = match telemetry::init(telemetry) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("idemgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = service.await;
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "idemgate stopped");
            eprintln!("idemgate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a setting that cannot work and returns the exit code for it.
pub fn config_error(error: &ConfigError) -> ExitCode {
    eprintln!("idemgate: {error}");
    ExitCode::from(EXIT_CONFIG)
}
