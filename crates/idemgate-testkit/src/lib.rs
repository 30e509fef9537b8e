//! Test support for idemgate: the one store conformance suite, the SQL stores'
//! suites, the fixtures they are made of, and the helpers every crate's tests share.
//!
//! A store proves itself with two lines in its tests:
//!
//! ```ignore
//! async fn store() -> std::sync::Arc<dyn idemgate_core::Store> {
//!     std::sync::Arc::new(idemgate_core::MemoryStore::new())
//! }
//! idemgate_testkit::store_conformance!(store);
//! idemgate_testkit::cached_conformance!(store);
//! ```
//!
//! There is exactly one copy of each suite, so backends cannot drift apart. The
//! second line runs the suite again behind the replay cache ([`cache`]), and proves
//! that an eviction on one instance reaches another's cache in bounded time.
//!
//! The SQL stores describe their test database once, in a `SqlHarness` (feature
//! `sql`; a `TransactionalHarness` on top of it with feature `transactional`), and
//! prove what they do with their table and their transactional mode
//! (`idemgate_sqlx::Tx`):
//!
//! ```ignore
//! idemgate_testkit::sql_store_conformance!(harness);
//! idemgate_testkit::transactional_conformance!(harness);
//! ```
//!
//! # Modules
//!
//! - [`wait`]: [`wait::wait_until`], a condition polled with a bound.
//! - [`conformance`]: the store conformance suite; [`cache`]: the same behind the
//!   replay cache; `sql_store` and `transactional`: the SQL stores' suites; `setup`:
//!   a SQL store's first setup behind the layer (feature `transactional`).
//! - [`fixtures`]: what the suites are made of and store tests borrow (fresh claim
//!   requests, an awkward response, completions, claims that must be acquired).
//! - `http` (feature `http`): `Answer`, a response read
//!   whole, for every crate's HTTP tests; [`net`]: [`free_port`] for the servers a
//!   test starts; [`relay`]: the fault relay client tests put between a client and
//!   the real server (for the JavaScript and Python suites, the `idemgate-relay`
//!   binary of this crate is the same relay as a process, controlled over its
//!   standard input).
//! - `upstreams` and `raw_client` (feature `upstreams`): three upstreams of a
//!   test's own for the proxy's tests (strict; lenient, routing the way popular
//!   frameworks do; naive keep-alive, ignoring bodies on `GET`), each recording
//!   every request as it parsed it, and a client that writes exactly the bytes a
//!   test gives it.
//! - `strategies` (feature `strategies`): proptest strategies for records and stored
//!   responses.

pub mod cache;
pub mod conformance;
pub mod fixtures;
#[cfg(feature = "upstreams")]
pub mod guard_cases;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "upstreams")]
mod http1;
pub mod net;
#[cfg(feature = "upstreams")]
pub mod raw_client;
pub mod relay;
#[cfg(feature = "transactional")]
pub mod setup;
#[cfg(feature = "sql")]
pub mod sql_store;
#[cfg(feature = "strategies")]
pub mod strategies;
pub mod tap;
#[cfg(feature = "transactional")]
pub mod transactional;
#[cfg(feature = "upstreams")]
pub mod upstreams;
pub mod wait;

#[cfg(feature = "http")]
pub use self::http::Answer;

/// What the macros expand to refers to, so a calling crate needs no matching
/// imports of its own. Not API.
#[doc(hidden)]
pub mod __private {
    pub use idemgate_core::Store;
}
pub use net::free_port;

/// Instantiates every test of [`conformance`] for one store, as `#[tokio::test]`s on a
/// multi-threaded runtime. `$factory` is an async fn returning `Arc<dyn Store>`;
/// it is called once per test.
///
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) among its
/// dev-dependencies.
#[macro_export]
macro_rules! store_conformance {
    ($factory:path) => {
        $crate::store_conformance!(@tests $factory;
            concurrent_claims_have_exactly_one_winner,
            complete_then_claim_replays,
            failed_completion_is_stored,
            fingerprint_mismatch_is_visible,
            field_digests_round_trip,
            records_without_field_digests_name_nothing,
            release_makes_the_record_claimable,
            lapsed_lease_has_exactly_one_takeover,
            stale_lease_cannot_write,
            expired_incarnation_cannot_write,
            ttl_expiry_without_purge,
            completion_restarts_the_ttl,
            renew_extends_the_lease,
            takeover_extends_the_record_life,
            delete_frees_the_key,
            completed_record_refuses_further_writes,
            scopes_are_isolated,
            responses_round_trip_byte_exact,
            absent_records_and_bounded_waits,
            waiters_wake_on_completion,
            evict_frees_a_completed_key,
            evict_refuses_a_live_lease_unless_forced,
            evict_absent_or_expired_key,
            evict_lapsed_lease_without_force,
            concurrent_evictions_remove_once,
            resource_lease_has_exactly_one_holder,
            resource_lease_excludes_under_contention,
            resource_lease_expiry_lets_another_holder_in,
            resource_lease_release_is_fenced,
            audit_journal_round_trips_and_chains,
            route_history_round_trips_bounded_per_route,
            stream_pieces_round_trip_in_order,
            stream_pieces_are_the_runs_own,
            stream_pieces_go_with_the_record,
            appended_pieces_wake_waiters,
        );
    };
    (@tests $factory:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::conformance::$name($factory().await).await;
            }
        )*
    };
}
