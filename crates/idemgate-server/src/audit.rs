//! The journal as the binary serves it (`docs/audit.md`): the journal writer in
//! front of the store (`--audit`), its retention task (`--audit-retention`),
//! the entry as JSON (`idemgate audit export`, `GET /v1/audit`), `audit verify`,
//! and the `evicted` entry an operator's eviction writes.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use idemgate::Store;
use idemgate::audit::{
    AuditEntry, AuditEvent, AuditQuery, AuditRecord, Break, Verifier, key_digest,
};
use idemgate::journal::{JournalConfig, Journaled};
use idemgate::scope::Identity;
use idemgate::time::Timestamp;
use serde::Serialize;

use crate::config::AuditSettings;

/// How many entries one read of the journal asks for.
pub const PAGE: usize = 1_000;

/// How often retention runs, and how many entries one run removes at most
/// (bounded work: a backlog is worked off over several runs).
const RETENTION_EVERY: Duration = Duration::from_secs(600);
const RETENTION_BATCH: usize = 10_000;

/// This instance's name in the journal: `HOSTNAME`, else the kernel's host
/// name, else `idemgate`. Processes sharing a name share a chain partition,
/// which the stores serialise, so a shared name is safe; a stable name (a
/// StatefulSet's pod name, a host name) keeps the partitions few.
pub fn instance_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| "idemgate".to_owned())
}

/// The journal in front of `store` when `settings` turn it on, and its
/// retention task. `None` when off.
pub async fn journal(
    store: Arc<dyn Store>,
    settings: &AuditSettings,
    memory_store: bool,
) -> Result<Option<Arc<Journaled>>, idemgate::StoreError> {
    if !settings.enabled(memory_store) {
        return Ok(None);
    }
    let secret = store.audit_secret().await?;
    let instance = instance_name();
    tracing::info!(%instance, retention_days = settings.retention.as_secs() / 86_400, "journal on");
    spawn_retention(Arc::clone(&store), settings.retention);
    Ok(Some(Arc::new(Journaled::new(
        store,
        JournalConfig { instance, secret },
    ))))
}

/// Trims entries older than `retention`, every [`RETENTION_EVERY`], at most
/// [`RETENTION_BATCH`] per run; counts what went
/// (`idemgate_audit_trimmed_total`), then how many entries the journal keeps
/// (`idemgate_audit_journal_entries`, read from the store: every instance's
/// partitions, so each process reports the whole journal's size).
fn spawn_retention(store: Arc<dyn Store>, retention: Duration) {
    metrics::counter!("idemgate_audit_trimmed_total").absolute(0);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(RETENTION_EVERY);
        loop {
            every.tick().await;
            let before = Timestamp::from_millis(
                Timestamp::now()
                    .as_millis()
                    .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)),
            );
            match store.trim_audit(None, before, RETENTION_BATCH).await {
                Ok(removed) => metrics::counter!("idemgate_audit_trimmed_total").increment(removed),
                Err(error) => tracing::warn!(%error, "journal retention failed; retrying later"),
            }
            match store.audit_partitions().await {
                Ok(partitions) => {
                    let entries: u64 = partitions.iter().map(|p| p.entries).sum();
                    metrics::gauge!("idemgate_audit_journal_entries").set(entries as f64);
                }
                Err(error) => tracing::warn!(%error, "the journal's size could not be read"),
            }
        }
    });
}

/// The `evicted` entry of an operator's eviction of `identity`, written at
/// once (not queued: the command exits right after).
pub async fn journal_eviction(
    store: &dyn Store,
    identity: &Identity,
    instance: String,
) -> Result<(), idemgate::StoreError> {
    let secret = store.audit_secret().await?;
    let scope = identity.scope();
    let record = AuditRecord {
        event: Some(AuditEvent::Evicted),
        operation_id: None,
        method: scope.method.clone(),
        route: scope.path.clone(),
        principal: scope.principal.as_str().to_owned(),
        key_digest: key_digest(&secret, identity.key().as_str()),
        fingerprint: None,
        status: None,
        duration_ms: None,
        instance,
    };
    store.append_audit(&[record]).await
}

/// One entry as JSON: the journal's contract fields, in its order.
#[derive(Debug, Serialize)]
pub struct EntryView {
    /// Position in the journal.
    pub seq: u64,
    /// RFC 3339, store clock.
    pub at: String,
    /// The event's name.
    pub event: &'static str,
    /// The operation.
    pub operation_id: Option<String>,
    /// The request method.
    pub method: String,
    /// The route template, or the normalized path.
    pub route: String,
    /// The principal as the record stores it.
    pub principal: String,
    /// HMAC-SHA256 of the key under the store's journal secret.
    pub key_digest: String,
    /// The request's fingerprint.
    pub fingerprint: Option<String>,
    /// The status answered.
    pub status: Option<u16>,
    /// The run's duration.
    pub duration_ms: Option<u64>,
    /// The writing instance (the chain partition).
    pub instance: String,
    /// The partition's previous hash.
    pub prev: String,
    /// This entry's hash.
    pub hash: String,
}

impl EntryView {
    /// The view of `entry`.
    pub fn of(entry: &AuditEntry) -> Self {
        let r = &entry.record;
        Self {
            seq: entry.seq,
            at: rfc3339(entry.at),
            event: r.event().as_str(),
            operation_id: r.operation_id.clone(),
            method: r.method.clone(),
            route: r.route.clone(),
            principal: r.principal.clone(),
            key_digest: r.key_digest.clone(),
            fingerprint: r.fingerprint.clone(),
            status: r.status,
            duration_ms: r.duration_ms,
            instance: r.instance.clone(),
            prev: entry.prev.to_hex(),
            hash: entry.hash.to_hex(),
        }
    }

    /// One JSON Lines line, newline included.
    pub fn line(entry: &AuditEntry) -> String {
        // A struct of strings and numbers always serializes.
        let mut line = serde_json::to_string(&Self::of(entry)).unwrap_or_default();
        line.push('\n');
        line
    }
}

fn rfc3339(at: Timestamp) -> String {
    let since_epoch = Duration::from_millis(u64::try_from(at.as_millis()).unwrap_or(0));
    humantime::format_rfc3339_millis(UNIX_EPOCH + since_epoch).to_string()
}

/// An RFC 3339 instant in UTC (`2026-12-03T10:00:00Z`, a fraction allowed) as
/// a store timestamp.
pub fn parse_time(text: &str) -> Result<Timestamp, String> {
    let at = humantime::parse_rfc3339_weak(text)
        .map_err(|error| format!("{text:?} is not an RFC 3339 time ({error})"))?;
    let millis = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?
        .as_millis();
    Ok(Timestamp::from_millis(
        i64::try_from(millis).unwrap_or(i64::MAX),
    ))
}

/// Which entries an export keeps beyond the store's range.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this principal's.
    pub principal: Option<String>,
    /// Only this key digest's.
    pub key_digest: Option<String>,
}

impl Filter {
    /// Whether `entry` passes.
    pub fn admits(&self, entry: &AuditEntry) -> bool {
        self.principal
            .as_deref()
            .is_none_or(|p| entry.record.principal == p)
            && self
                .key_digest
                .as_deref()
                .is_none_or(|k| entry.record.key_digest == k)
    }
}

/// Every entry in `range` that passes `filter`, oldest first, handed to `each`
/// page by page. Returns how many passed.
pub async fn export(
    store: &dyn Store,
    mut range: AuditQuery,
    filter: &Filter,
    mut each: impl FnMut(&AuditEntry),
) -> Result<u64, idemgate::StoreError> {
    range.limit = PAGE;
    let mut passed = 0;
    loop {
        let page = store.read_audit(&range).await?;
        let Some(last) = page.last() else {
            return Ok(passed);
        };
        range.after = Some(last.seq);
        for entry in page.iter().filter(|e| filter.admits(e)) {
            each(entry);
            passed += 1;
        }
    }
}

/// What `audit verify` found.
#[derive(Debug)]
pub enum Verified {
    /// Intact: how many entries, and each partition's head (to anchor elsewhere).
    Intact {
        /// Entries checked.
        entries: u64,
        /// `(instance, head hex)`.
        heads: Vec<(String, String)>,
    },
    /// The first break.
    Broken(Break),
}

/// Reads the whole journal and checks its chains ([`Verifier`]).
pub async fn verify(store: &dyn Store) -> Result<Verified, idemgate::StoreError> {
    let partitions = store.audit_partitions().await?;
    let mut verifier = Verifier::new(&partitions);
    let mut range = AuditQuery::all(PAGE);
    loop {
        let page = store.read_audit(&range).await?;
        let Some(last) = page.last() else { break };
        range.after = Some(last.seq);
        for entry in &page {
            if let Err(found) = verifier.push(entry) {
                return Ok(Verified::Broken(found));
            }
        }
    }
    match verifier.finish() {
        Ok(entries) => Ok(Verified::Intact {
            entries,
            heads: partitions
                .into_iter()
                .map(|p| (p.instance, p.head.to_hex()))
                .collect(),
        }),
        Err(found) => Ok(Verified::Broken(found)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_rfc3339() {
        assert_eq!(
            parse_time("2025-12-01T12:00:00.123Z").unwrap().as_millis(),
            1_764_590_400_123
        );
        assert_eq!(
            rfc3339(Timestamp::from_millis(1_764_590_400_123)),
            "2025-12-01T12:00:00.123Z"
        );
        assert!(parse_time("yesterday").is_err());
    }
}
