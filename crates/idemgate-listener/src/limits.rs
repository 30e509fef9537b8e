//! The process's file-descriptor limit: raised at startup, and the reserve the
//! connection bound leaves for everything else the process opens.

/// File descriptors kept out of the connection bound for everything else the
/// process opens: database and Redis pools, the payment gateway client, SQLite
/// files, the runtime's own descriptors.
pub(crate) const FD_RESERVE: u64 = 128;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit
/// now in force (`None` where it cannot be read). Call it once at startup, before
/// binding: a soft limit of 1024 (a common default) is a few hundred slow clients.
pub fn raise_fd_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => Some(soft),
        Err(error) => {
            tracing::warn!(%error, "could not raise the open-file limit");
            fd_limit()
        }
    }
}

/// The soft `RLIMIT_NOFILE`, if it can be read.
pub(crate) fn fd_limit() -> Option<u64> {
    rlimit::getrlimit(rlimit::Resource::NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}
