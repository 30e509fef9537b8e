//! The fault suite: the real `idemgate` binary killed with `kill -9` while the payment
//! gateway holds its charge, two instances on one store with one frozen past its
//! lease, and a PostgreSQL or Redis process of the test's own killed or frozen under
//! load. Every scenario asserts effects, per idempotency key: the orders in the
//! database and the distinct charges the counting mock gateway made. And an edit
//! killed between its commit and its record's completion: its retry answers the
//! edit's original 200, never a 412 (`edits`). And ledger transfers in the
//! one-transaction mode while that PostgreSQL is killed or frozen (`transfers`).
//!
//! Small counts by default (part of `scripts/test.sh`); `IDEMGATE_FAULTS_FULL=1` runs
//! the counts `docs/reliability.md` publishes, and `IDEMGATE_FAULTS_SEED` replays a
//! run's random choices (each test prints its seed).
//!
//! The harness (server process, mock gateway, client) is `tests/support`, shared by
//! every test binary of the crate.

#![allow(dead_code, unreachable_pub)]

mod support;

/// The fault scenarios and their shared parts (budget, effects, own store
/// processes, setups), a file each under `tests/faults/`.
mod faults {
    mod budget;
    mod effects;
    mod own_stores;
    mod setups;

    mod batch_crash;
    mod crash;
    mod edits;
    mod outage;
    mod takeover;
    mod transfers;
}
