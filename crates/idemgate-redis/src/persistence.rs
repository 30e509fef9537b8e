//! The startup check of persistence (`appendonly`, `appendfsync`, `save`): a Redis
//! that persists nothing forgets every record on restart, and every completed key
//! then runs again as a new operation.

use crate::connection::Connection;
use crate::error::RedisStoreError;
use crate::server_config::{self, NodeConfig};

/// What a constructor does when Redis persists nothing (`appendonly no` and `save
/// ""`), or when it cannot tell (`CONFIG GET` refused, as on many managed services).
///
/// Without persistence a restart of Redis loses every record: completed keys are
/// forgotten and their retries run the operation again, with a new operation id that
/// nothing links to the first run (an external black-box run saw 20 of 20 completed
/// keys run again after a restart). See the [crate docs](crate#persistence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PersistenceCheck {
    /// Log one `tracing` warning naming the risk and the fix, and go on: the default,
    /// since a cache-like deployment where a duplicate is harmless is legitimate.
    #[default]
    Warn,
    /// Fail the constructor with [`RedisStoreError::NoPersistence`], or with
    /// [`RedisStoreError::PersistenceUnknown`] when the settings cannot be read (a
    /// store told to insist on persistence does not start on a guess).
    Refuse,
}

/// How often the append-only file is flushed to disk (`appendfsync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AppendFsync {
    /// `no`: the operating system decides; a power loss loses ~30 s of writes.
    No,
    /// `everysec`: a Redis crash loses nothing, a power loss up to ~1 s of writes.
    EverySec,
    /// `always`: fsync before every reply; survives power loss.
    Always,
}

/// The persistence a store found at startup: on a cluster, the weakest of all
/// primaries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing is persisted (`appendonly no`, `save ""`): a restart loses every record.
    None,
    /// RDB snapshots only (the `save` schedule, e.g. `3600 1 300 100`): a crash loses
    /// the writes since the last snapshot.
    Snapshots {
        /// The `save` setting as the server reported it.
        save: String,
    },
    /// The append-only file is on.
    AppendOnly {
        /// Its `appendfsync` setting.
        fsync: AppendFsync,
    },
    /// `CONFIG GET` was refused or failed on some node.
    Unknown,
}

impl Persistence {
    /// Orders the kinds from weakest to strongest, to combine cluster nodes.
    fn strength(&self) -> u8 {
        match self {
            Self::None => 0,
            Self::Unknown => 1,
            Self::Snapshots { .. } => 2,
            Self::AppendOnly { fsync } => 3 + *fsync as u8,
        }
    }

    fn of_node(node: NodeConfig) -> Self {
        let Some(settings) = node else {
            return Self::Unknown;
        };
        let get = |name: &str| settings.get(name).map(String::as_str);
        match (get("appendonly"), get("save")) {
            (Some("yes"), _) => Self::AppendOnly {
                fsync: match get("appendfsync") {
                    Some("always") => AppendFsync::Always,
                    Some("everysec") => AppendFsync::EverySec,
                    _ => AppendFsync::No,
                },
            },
            (Some(_), Some(save)) if save.trim().is_empty() => Self::None,
            (Some(_), Some(save)) => Self::Snapshots {
                save: save.to_owned(),
            },
            _ => Self::Unknown,
        }
    }
}

/// Reads the persistence of the server, or of every primary of a cluster (the
/// weakest wins).
pub(crate) async fn read_persistence(connection: &Connection) -> Persistence {
    server_config::read(connection, &["appendonly", "appendfsync", "save"])
        .await
        .into_iter()
        .map(Persistence::of_node)
        .min_by_key(Persistence::strength)
        .unwrap_or(Persistence::Unknown)
}

/// Applies `check` to what was found: one warning, or the constructor's error.
pub(crate) fn enforce(
    persistence: &Persistence,
    check: PersistenceCheck,
) -> Result<(), RedisStoreError> {
    match (persistence, check) {
        (Persistence::None, PersistenceCheck::Refuse) => Err(RedisStoreError::NoPersistence),
        (Persistence::Unknown, PersistenceCheck::Refuse) => {
            Err(RedisStoreError::PersistenceUnknown)
        }
        (Persistence::None, PersistenceCheck::Warn) => {
            tracing::warn!(
                persistence = "none",
                "Redis persists nothing (appendonly no, save \"\"): a Redis restart forgets every \
                 idempotency record, and every completed key runs again on its next retry; \
                 enable AOF (appendonly yes, appendfsync everysec or always)"
            );
            Ok(())
        }
        (Persistence::Unknown, PersistenceCheck::Warn) => {
            tracing::warn!(
                persistence = "unknown",
                "could not read Redis persistence settings (CONFIG GET refused?); make sure AOF \
                 is on (appendonly yes), or a Redis restart forgets every record and completed \
                 keys run again"
            );
            Ok(())
        }
        (Persistence::Snapshots { .. } | Persistence::AppendOnly { .. }, _) => Ok(()),
    }
}
