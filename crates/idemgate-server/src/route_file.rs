//! The proxy's route file (`--config FILE`): the one loader that startup,
//! `--check-config` and a `SIGHUP` reload all go through, what was loaded (its
//! SHA-256 and load time, for the admin API's `GET /v1/config`), and the reload
//! itself: refused when the new file is bad (the old routes kept, the error
//! logged and counted in `idemgate_config_reloads_total{result="error"}`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use idemgate_proxy::{Policy, RouteTable, Routes, RoutesError};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The reload counter, labelled `result="ok"` or `result="error"`.
pub const RELOADS_METRIC: &str = "idemgate_config_reloads_total";

/// 1 while the routes served are the file's last good version and no later
/// reload was refused, 0 after a refused one (until a good reload): what the
/// `IdemgateConfigReloadFailed` alert watches, as Prometheus's own
/// `prometheus_config_last_reload_successful`.
pub const LAST_RELOAD_METRIC: &str = "idemgate_config_last_reload_successful";

/// One route file as it was loaded: which file, which bytes, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteFileInfo {
    /// The file, as given to `--config`.
    pub path: PathBuf,
    /// The SHA-256 of the bytes parsed, in hex: compare it with `sha256sum FILE`
    /// to know which version a running proxy follows.
    pub sha256: String,
    /// When it was loaded (RFC 3339, UTC).
    pub loaded_at: String,
    /// How many `[[route]]` tables it has.
    pub routes: usize,
}

/// Reads the route file at `path` and checks it exactly as the proxy follows
/// it: every key, and each route resolved over `defaults` (the command line's
/// default route) — `Routes::from_toml`, the one loader. Every caller —
/// startup, `--check-config`, a reload — goes through here, so a file this
/// accepts is one the proxy starts with.
pub fn load(path: &Path, defaults: &Policy) -> Result<(Routes, RouteFileInfo), RoutesError> {
    let bytes = std::fs::read(path).map_err(|source| read_error(path, source))?;
    let text = std::str::from_utf8(&bytes).map_err(|error| {
        read_error(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, error),
        )
    })?;
    let routes = Routes::from_toml(path, text, defaults)?;
    let info = RouteFileInfo {
        path: path.to_owned(),
        sha256: hex::encode(Sha256::digest(&bytes)),
        loaded_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        routes: routes.len(),
    };
    Ok((routes, info))
}

fn read_error(path: &Path, source: std::io::Error) -> RoutesError {
    RoutesError::Read {
        path: path.to_owned(),
        source,
    }
}

/// The last reload that was refused, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefusedReload {
    /// When (RFC 3339, UTC).
    pub at: String,
    /// Why: `file:line:col: problem`, as `--check-config` prints it.
    pub error: String,
}

/// What `GET /v1/config` answers: the file the proxy follows now, and the last
/// reload that was refused after it was loaded (`null` when none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RouteFileView {
    /// `null` without `--config` (every request gets the defaults).
    pub loaded: Option<RouteFileInfo>,
    /// The last refused reload since `loaded` was loaded.
    pub last_error: Option<RefusedReload>,
}

/// The file the running proxy follows and how to reload it: the table its
/// dispatcher reads (and whose default route each reload is checked over), and
/// the record the admin API shows. Cloned into the `SIGHUP` task and the admin
/// state.
#[derive(Clone)]
pub struct RouteFile {
    table: RouteTable,
    /// Only ever held to copy or assign the record, never across a file read or
    /// a table build: the admin API reads it from the runtime's workers.
    view: Arc<RwLock<RouteFileView>>,
    /// One reload at a time, held across the load (an async lock: it waits
    /// without blocking a worker), so two overlapping reloads cannot leave the
    /// older file's table or record installed over the newer one's.
    reloading: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for RouteFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteFile")
            .field("view", &self.view())
            .finish_non_exhaustive()
    }
}

impl RouteFile {
    /// The route file `loaded` (if any) that `table` was built from; reloads are
    /// checked over the table's default route, as at startup. Registers the
    /// reload counter at zero, so `increase()` sees the first reload.
    pub fn new(table: RouteTable, loaded: Option<RouteFileInfo>) -> Self {
        metrics::describe_counter!(
            RELOADS_METRIC,
            "Route file reloads (SIGHUP), by result: ok (the new routes serve) or error (refused, the old routes kept)."
        );
        metrics::describe_gauge!(
            LAST_RELOAD_METRIC,
            "1 unless the last route file reload was refused (then 0 until a good one): the proxy serves routes that are not the file on disk."
        );
        for result in ["ok", "error"] {
            metrics::counter!(RELOADS_METRIC, "result" => result).increment(0);
        }
        metrics::gauge!(LAST_RELOAD_METRIC).set(1.0);
        Self {
            table,
            view: Arc::new(RwLock::new(RouteFileView {
                loaded,
                last_error: None,
            })),
            reloading: Arc::default(),
        }
    }

    /// What the admin API shows.
    pub fn view(&self) -> RouteFileView {
        // A poisoned lock only means a writer panicked mid-assignment of plain
        // values; what it holds is still whole.
        self.view
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reloads the file loaded at startup: a good file replaces the routes at
    /// once (requests in flight finish under the old ones); a bad one is
    /// refused and the old routes keep serving. Logged and counted either way.
    /// Without `--config` there is nothing to reload (logged, not counted).
    ///
    /// The read, the parse and the table build run on the blocking pool; the
    /// record's lock is taken only to assign the outcome, after the new table
    /// is in place (so a record that names the new file means its routes serve).
    pub async fn reload(&self) -> Result<RouteFileInfo, ReloadError> {
        let _one_at_a_time = self.reloading.lock().await;
        let Some(path) = self.view().loaded.map(|info| info.path) else {
            tracing::warn!("SIGHUP: no --config file, nothing to reload");
            return Err(ReloadError::NoFile);
        };
        let table = self.table.clone();
        let file = path.clone();
        let loaded: Result<RouteFileInfo, RoutesError> =
            match tokio::task::spawn_blocking(move || {
                let (routes, info) = load(&file, table.defaults())?;
                table.replace(&routes);
                Ok(info)
            })
            .await
            {
                Ok(loaded) => loaded,
                Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
                // Cancelled: the runtime is shutting down, nothing was installed.
                Err(_) => return Err(ReloadError::Interrupted),
            };
        match loaded {
            Ok(info) => {
                metrics::counter!(RELOADS_METRIC, "result" => "ok").increment(1);
                metrics::gauge!(LAST_RELOAD_METRIC).set(1.0);
                tracing::info!(
                    path = %path.display(),
                    sha256 = %info.sha256,
                    routes = info.routes,
                    "route file reloaded"
                );
                let mut view = self.write_view();
                view.loaded = Some(info.clone());
                view.last_error = None;
                Ok(info)
            }
            Err(error) => {
                metrics::counter!(RELOADS_METRIC, "result" => "error").increment(1);
                metrics::gauge!(LAST_RELOAD_METRIC).set(0.0);
                tracing::error!(%error, "route file reload refused; the previous routes keep serving");
                self.write_view().last_error = Some(RefusedReload {
                    at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                    error: error.to_string(),
                });
                Err(ReloadError::Refused(error))
            }
        }
    }

    fn write_view(&self) -> std::sync::RwLockWriteGuard<'_, RouteFileView> {
        // As in `view`: what a poisoned lock holds is still whole.
        self.view
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The proxy runs without `--config`.
    #[error("no --config file to reload")]
    NoFile,
    /// The new file is bad; the old routes keep serving.
    #[error(transparent)]
    Refused(RoutesError),
    /// The process shut down before the new file was loaded; nothing changed.
    #[error("the reload was interrupted by shutdown")]
    Interrupted,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_digest_is_of_the_bytes_and_a_bad_file_names_its_place() {
        let dir = std::env::temp_dir().join(format!("idemgate-route-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("routes.toml");
        let text = "[[route]]\nmethod = \"POST\"\npath = \"/pay\"\n";
        std::fs::write(&path, text).unwrap();
        let timed = |ttl, lease| {
            let mut defaults = Policy::default();
            defaults.ttl = Duration::from_secs(ttl);
            defaults.lease = Duration::from_secs(lease);
            defaults
        };
        let (routes, info) = load(&path, &timed(60, 5)).unwrap();
        assert_eq!(routes.len(), 1);
        assert_eq!(info.routes, 1);
        assert_eq!(info.sha256, hex::encode(Sha256::digest(text.as_bytes())));
        let error = load(&path, &timed(5, 5)).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("{}:1:1: ", path.display())),
            "{error}"
        );
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let error = load(&path, &timed(60, 5)).unwrap_err();
        assert!(matches!(error, RoutesError::Read { .. }), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
