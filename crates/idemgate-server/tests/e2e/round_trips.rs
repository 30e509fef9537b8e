//! Round trips to PostgreSQL per request, counted on the wire: the real binary
//! reaches its own database through a [`Tap`], which counts what the server's
//! connections send (one send per round trip: sqlx waits for each answer), as
//! `docs/postgres-round-trips.md` counts them with `strace`. The journal is off:
//! its batched entries ride on their own schedule.

use reqwest::StatusCode;
use sqlx::Connection;

use idemgate_testkit::tap::Tap;

use crate::support::client::{Client, ORDER, new_key};
use crate::support::databases::OwnDatabase;
use crate::support::server::{Options, Server, postgres_url};

/// Requests sent before counting (the pool's connections opened, statements
/// prepared), then counted.
const WARM_UP: usize = 100;
const COUNTED: usize = 40;

/// Pings the pool may send beside the counted requests' own round trips: for
/// a pooled connection that sat idle past `IDLE_PING_AFTER` (the pool hands its
/// idle connections out in turn, and on a machine loaded by the rest of the
/// suite forty sequential orders can leave one idle that long: CI once counted
/// four), or for the release of a record sent just before the count began.
/// Fewer than one per four requests: one more round trip per request adds
/// `COUNTED`, which these never hide.
const STRAY_PINGS: usize = COUNTED / 4;

/// What the tap counted over `COUNTED` sequential orders, each under a new key
/// (or none: `keyed` false), on one keep-alive connection.
struct Counted {
    sends: usize,
    /// Connections the pool opened meanwhile: each sends its startup and
    /// prepares the statements again.
    opened: usize,
    /// Executions the layer recorded in the route's history meanwhile (at most
    /// one per 100 ms): a statement and its release's ping each.
    history_records: usize,
}

async fn count_orders(flags: impl FnOnce(Options) -> Options, keyed: bool) -> Counted {
    let database = OwnDatabase::create("trips").await;
    let options: sqlx::postgres::PgConnectOptions = postgres_url().parse().expect("url");
    let tap = Tap::start_to(options.get_host(), options.get_port()).await;
    let server = Server::start(flags(Options::new(&database.url_through(tap.addr())))).await;
    let client = Client::new();
    let url = server.url("/api/v1/orders");
    let order = async || {
        let key = keyed.then(new_key);
        let answer = client.post(&url, key.as_deref(), ORDER).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    };
    for _ in 0..WARM_UP {
        order().await;
    }
    // The last release's ping goes in a task of its own: let it land first.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut direct = sqlx::PgConnection::connect(&database.url())
        .await
        .expect("PostgreSQL, direct");
    let started: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&mut direct)
        .await
        .expect("the database's clock");
    let (before, connections_before) = (tap.client_sends(), tap.connections());
    for _ in 0..COUNTED {
        order().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let sends = tap.client_sends() - before;
    let opened = tap.connections() - connections_before;
    // Fewer than the table's 32 slots per route: none was overwritten.
    let history_records: i64 = if keyed {
        sqlx::query_scalar(
            "SELECT count(*) FROM idemgate_records_durations WHERE recorded_at > $1::timestamptz",
        )
        .bind(&started)
        .fetch_one(&mut direct)
        .await
        .expect("the route's history")
    } else {
        0
    };
    drop(direct);
    server.stop().await;
    database.drop_it().await;
    Counted {
        sends,
        opened,
        history_records: usize::try_from(history_records).expect("a count"),
    }
}

/// A new key in the two-phase transactional mode: the claim, its release's
/// ping; `BEGIN`, the order's insert, the completion, `COMMIT`, the release's
/// ping. No ping at checkout (the pool pings only connections that sat idle):
/// 7, where sqlx's default made it 9. Beside them: the route's history; a
/// connection the pool opened meanwhile (its startup, and up to its four
/// statements prepared again); a ping for a pooled connection that sat idle
/// past `IDLE_PING_AFTER`, or for the release of a record sent just before the
/// count began ([`STRAY_PINGS`] at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_on_postgres_is_seven_round_trips() {
    let counted = count_orders(|options| options.arg("--audit", "off"), true).await;
    assert!(counted.history_records < 32, "{}", counted.history_records);
    let orders = counted.sends - 2 * counted.history_records;
    let beside = STRAY_PINGS + 5 * counted.opened;
    assert!(
        (7 * COUNTED..=7 * COUNTED + beside).contains(&orders),
        "{orders} sends to PostgreSQL for {COUNTED} new keys (beside the {} of the route's history; {} connections opened): 7 each",
        2 * counted.history_records,
        counted.opened
    );
}

/// The baseline the benchmark divides by (`--no-idempotency`): the order's
/// insert and the release's ping, 2 (3 with a ping at every checkout), beside
/// what a connection opened meanwhile or one idle past `IDLE_PING_AFTER` adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_order_on_postgres_is_two_round_trips() {
    let counted = count_orders(|options| options.switch("--no-idempotency"), false).await;
    let beside = STRAY_PINGS + 5 * counted.opened;
    assert!(
        (2 * COUNTED..=2 * COUNTED + beside).contains(&counted.sends),
        "{} sends to PostgreSQL for {COUNTED} bare orders ({} connections opened): 2 each",
        counted.sends,
        counted.opened
    );
}
