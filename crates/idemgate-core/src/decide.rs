//! The pure decision over an existing record (PROTOCOL §6.3).
//!
//! No I/O and no clock of its own: the store's snapshot carries its `now`, so the
//! rules are unit-tested here and behave the same over every backend.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::record::StoredResponse;
use crate::store::Snapshot;

/// What to answer a request whose claim found an existing record.
///
/// Exhaustive on purpose: every surface (the layer, a proxy) must answer each case.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Same key, other request: 422.
    Mismatch,
    /// The first request still runs: 409 with `Retry-After`, or wait.
    InProgress {
        /// Time left on the holder's lease, at least one second.
        retry_after: Duration,
    },
    /// A final response is stored: replay it.
    Replay(&'a StoredResponse),
    /// Released, or its lease lapsed, since it was read: claim again.
    Claimable,
}

/// Decides what a request with `fingerprint` gets, in the order PROTOCOL §6.3 gives:
/// a fingerprint mismatch wins over everything, even while the first request runs.
pub fn decide<'a>(snapshot: &'a Snapshot, fingerprint: &Fingerprint) -> Decision<'a> {
    let record = &snapshot.record;
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    if let Some(response) = record.response() {
        return Decision::Replay(response);
    }
    if record.claim_origin(fingerprint, snapshot.now).is_some() {
        return Decision::Claimable;
    }
    // Same fingerprint, not final, not claimable: a live lease.
    let left = record
        .locked_until()
        .map_or(Duration::ZERO, |until| until.duration_since(snapshot.now));
    Decision::InProgress {
        retry_after: left.max(Duration::from_secs(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{FencingToken, OperationId, Record, RecordState, RecordStatus, StoredBody};
    use crate::time::Timestamp;
    use http::StatusCode;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_bytes([n; 32])
    }

    fn snapshot(status: RecordStatus, locked_until: Option<i64>, now: i64) -> Snapshot {
        let response = status.is_final().then(|| StoredResponse {
            trailers: Vec::new(),
            status: StatusCode::CREATED,
            headers: vec![],
            body: StoredBody::Retained("done".into()),
        });
        let state =
            RecordState::from_parts(status, locked_until.map(Timestamp::from_millis), response)
                .expect("a consistent test record");
        Snapshot {
            record: Record {
                fingerprint: fp(1),
                field_digests: None,
                format_version: 1,
                operation_id: OperationId::generate(),
                token: FencingToken(1),
                state,
                created_at: Timestamp::from_millis(0),
                expires_at: Timestamp::from_millis(1_000_000),
            },
            now: Timestamp::from_millis(now),
        }
    }

    #[test]
    fn mismatch_wins_in_every_state() {
        for status in [
            RecordStatus::Processing,
            RecordStatus::Completed,
            RecordStatus::Failed,
            RecordStatus::Released,
        ] {
            let s = snapshot(status, Some(10_000), 0);
            assert_eq!(decide(&s, &fp(2)), Decision::Mismatch, "{status:?}");
        }
    }

    #[test]
    fn live_lease_is_in_progress_with_retry_after_at_least_one_second() {
        let s = snapshot(RecordStatus::Processing, Some(7_400), 1_000);
        assert_eq!(
            decide(&s, &fp(1)),
            Decision::InProgress {
                retry_after: Duration::from_millis(6_400)
            }
        );
        let s = snapshot(RecordStatus::Processing, Some(1_200), 1_000);
        assert_eq!(
            decide(&s, &fp(1)),
            Decision::InProgress {
                retry_after: Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn final_records_replay() {
        for status in [RecordStatus::Completed, RecordStatus::Failed] {
            let s = snapshot(status, None, 0);
            assert!(
                matches!(decide(&s, &fp(1)), Decision::Replay(r) if r.status == StatusCode::CREATED)
            );
        }
    }

    #[test]
    fn released_and_lapsed_records_are_claimable() {
        assert_eq!(
            decide(&snapshot(RecordStatus::Released, None, 0), &fp(1)),
            Decision::Claimable
        );
        assert_eq!(
            decide(
                &snapshot(RecordStatus::Processing, Some(1_000), 1_000),
                &fp(1)
            ),
            Decision::Claimable
        );
    }
}
