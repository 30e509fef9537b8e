//! Ended runs announced across instances: `LISTEN/NOTIFY`.
//!
//! A waiter marks the record it waits for (`waited = true`, one `UPDATE` that
//! applies only while the record is in progress); the statement that ends the run
//! — completion (on the pool or inside a business transaction), release, delete,
//! eviction — calls `pg_notify` on the store's channel when, and only when, the
//! row it ends carries the mark. Keys nobody waits for notify nothing, so ordinary
//! traffic never takes PostgreSQL's commit-time notification lock. The mark and
//! the end of the run update the same row, so one of them waits for the other:
//! either the end sees the mark and notifies, or the mark finds the run ended and
//! the waiter reads at once. A notification is sent at commit, never for a
//! rolled-back completion.
//!
//! A stream's appended piece (`crate::pieces`) is announced the same way, when
//! the record is marked, with the payload `<identity>+piece`: it wakes the
//! waiters on the identity, but the run goes on, so this instance keeps its mark
//! (and its waiters need not write it again). The first wait of an instance on
//! a run marks the record after its caller read the stream: a piece appended in
//! between, before the mark, is announced to nobody, and that waiter learns of
//! it from the next announcement or its timeout (the layer's recheck).
//!
//! One listener per store (its own connection, outside the store's pool, opened at
//! the first wait) wakes the waiters of this instance whose record was announced.
//! A hint only: while it reconnects, waiters fall back to their timeouts, and
//! after a reconnect every waiter looks again (a notification may have been lost).

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use idemgate_core::scope::IdentityDigest;
use idemgate_core::signals::ChangeSignals;
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::watch;

/// The pause before listening again after the listener failed.
const RELISTEN_DELAY: Duration = Duration::from_secs(1);

/// At most this many identities are remembered as marked by this instance; past
/// it the memory is cleared (waiters then mark again, harmlessly).
const MAX_MARKED: usize = 10_000;

/// What this instance knows of its listener and its marks.
#[derive(Debug, Default)]
pub(crate) struct Announcements {
    /// Records this instance marked and whose end it has not heard of yet: a
    /// second waiter on one of them need not write the mark again.
    marked: Mutex<HashSet<IdentityDigest>>,
}

impl Announcements {
    /// Whether this instance already marked `identity` and has not heard it end.
    pub(crate) fn is_marked(&self, identity: &IdentityDigest) -> bool {
        self.lock().contains(identity)
    }

    /// Remembers that `identity` is marked.
    pub(crate) fn marked(&self, identity: &IdentityDigest) {
        let mut marked = self.lock();
        if marked.len() >= MAX_MARKED {
            marked.clear();
        }
        marked.insert(*identity);
    }

    /// Forgets `identity`'s mark: its run ended (announced), so a later waiter on
    /// a new run of it must mark again.
    fn ended(&self, identity: &IdentityDigest) {
        self.lock().remove(identity);
    }

    fn forget_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<IdentityDigest>> {
        self.marked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The channel of a record table: a name derived from its qualified name
/// (a channel name is at most 63 bytes; a table's qualified name may be longer).
pub(crate) fn channel(qualified_table: &str) -> String {
    // FNV-1a, 64 bits: stable across builds and platforms.
    let hash = qualified_table
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("idemgate_changes_{hash:016x}")
}

/// Listens on `channel` through a connection of its own (the options of `pool`,
/// never one of its connections) and wakes this instance's waiters on every
/// identity announced, until the store (which owns `signals`) is gone.
/// `listening` is `true` while `LISTEN` is in effect: a waiter marks a record only
/// once it would hear the announcement.
pub(crate) async fn run(
    pool: PgPool,
    channel: String,
    signals: Weak<ChangeSignals>,
    announcements: Weak<Announcements>,
    listening: watch::Sender<bool>,
) {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with((*pool.connect_options()).clone());
    drop(pool);
    loop {
        let listened = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listened.await {
            Ok(mut listener) => {
                listening.send_replace(true);
                loop {
                    let next = listener.try_recv().await;
                    let (Some(signals), Some(announcements)) =
                        (signals.upgrade(), announcements.upgrade())
                    else {
                        return;
                    };
                    match next {
                        Ok(Some(notification)) => {
                            hear(notification.payload(), &signals, &announcements);
                        }
                        // The connection was lost and made again (LISTEN
                        // included): what was announced meanwhile is lost, so
                        // every waiter looks again, and marks again.
                        Ok(None) => {
                            announcements.forget_all();
                            signals.notify_all();
                        }
                        Err(error) => {
                            tracing::debug!(%error, "PostgreSQL change listener failed; listening again");
                            break;
                        }
                    }
                }
                listening.send_replace(false);
            }
            Err(error) => tracing::debug!(%error, "could not listen for PostgreSQL changes"),
        }
        if signals.strong_count() == 0 {
            return;
        }
        if let Some(announcements) = announcements.upgrade() {
            announcements.forget_all();
        }
        tokio::time::sleep(RELISTEN_DELAY).await;
    }
}

/// Acts on one notification: wakes this instance's waiters on its identity,
/// and forgets the mark when the run ended (a piece leaves it: the run goes on).
fn hear(payload: &str, signals: &ChangeSignals, announcements: &Announcements) {
    if let Some((identity, news)) = parse(payload) {
        if news == News::Ended {
            announcements.ended(&identity);
        }
        signals.notify(&identity);
    }
}

/// What follows the identity in the payload announcing an appended piece.
pub(crate) const PIECE_SUFFIX: &str = "+piece";

/// What a notification announces of its identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum News {
    /// The run ended (completed, released, deleted, evicted): the payload is
    /// the identity alone.
    Ended,
    /// The run appended a piece of its stream and goes on ([`PIECE_SUFFIX`]).
    Piece,
}

/// The identity (its 64 hex digits) and the news of a notification's payload.
fn parse(payload: &str) -> Option<(IdentityDigest, News)> {
    let (hex, news) = match payload.strip_suffix(PIECE_SUFFIX) {
        Some(hex) => (hex, News::Piece),
        None => (payload, News::Ended),
    };
    if hex.len() != 64 {
        return None;
    }
    let mut bytes = [0_u8; 32];
    for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some((IdentityDigest::from_bytes(bytes), news))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_the_identity_and_nothing_else_parses() {
        let identity = IdentityDigest::from_bytes([0xab; 32]);
        assert_eq!(parse(&"ab".repeat(32)), Some((identity, News::Ended)));
        assert_eq!(parse("ab"), None);
        assert_eq!(parse(&"zz".repeat(32)), None);
    }

    #[test]
    fn a_piece_payload_names_the_identity_and_does_not_end_the_run() {
        let identity = IdentityDigest::from_bytes([0x0f; 32]);
        let hex = "0f".repeat(32);
        assert_eq!(
            parse(&format!("{hex}{PIECE_SUFFIX}")),
            Some((identity, News::Piece))
        );
        // Upper-case hex parses too (`encode(…, 'hex')` writes lower case).
        assert_eq!(
            parse(&format!("{}{PIECE_SUFFIX}", "0F".repeat(32))),
            Some((identity, News::Piece))
        );
        for bad in [
            PIECE_SUFFIX.to_owned(),
            format!("ab{PIECE_SUFFIX}"),
            format!("{}{PIECE_SUFFIX}", "zz".repeat(32)),
            format!("{hex}{PIECE_SUFFIX}{PIECE_SUFFIX}"),
            format!("{hex}+other"),
            format!("{hex}{}", PIECE_SUFFIX.to_uppercase()),
            format!("{PIECE_SUFFIX}{hex}"),
        ] {
            assert_eq!(parse(&bad), None, "{bad}");
        }
    }

    /// A piece wakes the identity's waiters but keeps this instance's mark; the
    /// end of the run wakes them and forgets it.
    #[tokio::test]
    async fn a_piece_wakes_waiters_and_only_the_end_of_a_run_forgets_the_mark() {
        let identity = IdentityDigest::from_bytes([0x42; 32]);
        let signals = ChangeSignals::new();
        let announcements = Announcements::default();
        announcements.marked(&identity);
        for (payload, still_marked) in [
            (format!("{}{PIECE_SUFFIX}", "42".repeat(32)), true),
            ("42".repeat(32), false),
        ] {
            let wait = signals.wait(&identity, Duration::from_secs(30));
            tokio::pin!(wait);
            assert!(futures_util::FutureExt::now_or_never(wait.as_mut()).is_none());
            hear(&payload, &signals, &announcements);
            tokio::time::timeout(Duration::from_secs(5), wait)
                .await
                .unwrap_or_else(|_| panic!("{payload} woke no waiter"));
            assert_eq!(
                announcements.is_marked(&identity),
                still_marked,
                "{payload}"
            );
        }
    }

    #[test]
    fn channels_are_short_stable_and_per_table() {
        let a = channel("\"idemgate_records\"");
        assert_eq!(a, channel("\"idemgate_records\""));
        assert_ne!(a, channel("\"s\".\"idemgate_records\""));
        assert!(a.len() < 63, "{a}");
    }
}
