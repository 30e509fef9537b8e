//! The orders database of every earlier release opens: each schema the
//! hand-rolled migrations of a release before `sqlx::migrate!` left behind is
//! built, holding an order, then opened the way a starting server opens it.
//! And a write on PostgreSQL is bounded by the store timeout
//! ([`OrdersDb::bounded`]) when the server stops answering.

use std::time::Duration;

use super::*;
use crate::orders::ledger;
use crate::orders::outcome::{self, Outcome};

/// The schemas of earlier releases, as each release's hand-rolled migration
/// left a database: the first release's orders table, then what each later
/// release added to it.
struct Releases {
    /// The first release's orders table.
    first: &'static str,
    /// `PUT /api/v1/orders/{order_id}`: the client's order id, unique per
    /// principal.
    natural_keys: &'static str,
    /// Conditional edits (the mutable fields and the version), then the ledger.
    edits_and_ledger: &'static str,
}

impl Releases {
    /// Each earlier release's database, oldest first: its name and its
    /// statements.
    fn each(&self) -> [(&'static str, Vec<&'static str>); 3] {
        [
            ("first", vec![self.first]),
            ("natural keys", vec![self.first, self.natural_keys]),
            (
                "edits and ledger",
                vec![self.first, self.natural_keys, self.edits_and_ledger],
            ),
        ]
    }
}

const SQLITE: Releases = Releases {
    first: "CREATE TABLE orders (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL UNIQUE,
            principal TEXT NOT NULL,
            amount INTEGER NOT NULL CHECK (amount > 0),
            currency TEXT NOT NULL,
            items TEXT NOT NULL,
            charge_id TEXT,
            status TEXT NOT NULL,
            created_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
        );
        CREATE INDEX orders_by_principal ON orders (principal, id);",
    natural_keys: "ALTER TABLE orders ADD COLUMN client_order_id TEXT;
        CREATE UNIQUE INDEX orders_by_client_id ON orders (principal, client_order_id);",
    edits_and_ledger: "ALTER TABLE orders ADD COLUMN note TEXT;
        ALTER TABLE orders ADD COLUMN shipping_address TEXT;
        ALTER TABLE orders ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
        CREATE TABLE accounts (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL UNIQUE,
            principal TEXT NOT NULL,
            balance INTEGER NOT NULL CHECK (balance >= 0),
            currency TEXT NOT NULL,
            version INTEGER NOT NULL DEFAULT 1
        );
        CREATE TABLE transfers (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            from_account INTEGER NOT NULL REFERENCES accounts (id),
            to_account INTEGER NOT NULL REFERENCES accounts (id),
            amount INTEGER NOT NULL CHECK (amount > 0),
            reference_id TEXT NOT NULL,
            balance_after INTEGER NOT NULL,
            UNIQUE (from_account, reference_id)
        );",
};

const POSTGRES: Releases = Releases {
    first: "CREATE TABLE orders (
            id BIGSERIAL PRIMARY KEY,
            operation_id UUID NOT NULL UNIQUE,
            principal TEXT NOT NULL,
            amount BIGINT NOT NULL CHECK (amount > 0),
            currency TEXT NOT NULL,
            items TEXT NOT NULL,
            charge_id TEXT,
            status TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        CREATE INDEX orders_by_principal ON orders (principal, id);",
    natural_keys: "ALTER TABLE orders ADD COLUMN client_order_id TEXT;
        CREATE UNIQUE INDEX orders_by_client_id ON orders (principal, client_order_id);",
    edits_and_ledger: "ALTER TABLE orders ADD COLUMN note TEXT;
        ALTER TABLE orders ADD COLUMN shipping_address TEXT;
        ALTER TABLE orders ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
        CREATE TABLE accounts (
            id BIGSERIAL PRIMARY KEY,
            operation_id UUID NOT NULL UNIQUE,
            principal TEXT NOT NULL,
            balance BIGINT NOT NULL CHECK (balance >= 0),
            currency TEXT NOT NULL,
            version BIGINT NOT NULL DEFAULT 1
        );
        CREATE TABLE transfers (
            id BIGSERIAL PRIMARY KEY,
            from_account BIGINT NOT NULL REFERENCES accounts (id),
            to_account BIGINT NOT NULL REFERENCES accounts (id),
            amount BIGINT NOT NULL CHECK (amount > 0),
            reference_id TEXT NOT NULL,
            balance_after BIGINT NOT NULL,
            UNIQUE (from_account, reference_id)
        );",
};

/// The order an earlier release stored, in the first release's columns.
const OLD_ORDER: &str = "INSERT INTO orders (operation_id, principal, amount, currency, items, charge_id, status)
    VALUES ('6f9619ff-8b86-d011-b42d-00c04fc964ff', 'old-principal', 1500, 'RUB', '[{\"id\":42,\"quantity\":1}]', 'ch_1', 'paid')";

const TIMEOUT: Duration = Duration::from_secs(5);

/// Builds at `url` the database an earlier release left (its `statements`,
/// then [`OLD_ORDER`]), opens it as a starting server does, and checks that
/// everything works on it: the old order reads back at version 1, a new one
/// takes a client order id, an edit compares the version, the ledger opens an
/// account; both migrations are recorded, and opening again changes nothing.
async fn opens_and_works(url: &DatabaseUrl, release: &str, statements: Vec<&'static str>) {
    let earlier = OrdersDb::connect(url, TIMEOUT).await.expect(release);
    for statement in statements.into_iter().chain([OLD_ORDER]) {
        let built = match &earlier {
            OrdersDb::Sqlite(db) => sqlx::raw_sql(statement).execute(db.pool()).await.map(drop),
            OrdersDb::Postgres(pool) => sqlx::raw_sql(statement).execute(pool).await.map(drop),
        };
        built.expect(release);
    }
    earlier.close().await;
    let db = OrdersDb::open(url, TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{release}: {error}"));
    let old = db.list("old-principal").await.expect("list");
    assert_eq!(old.len(), 1, "{release}");
    let old = &old[0];
    assert_eq!((old.amount, old.version), (1500, 1), "{release}");
    assert_eq!(
        (&old.note, &old.client_order_id),
        (&None, &None),
        "{release}"
    );
    let new =
        NewOrder::parse(br#"{"items":[{"id":7,"quantity":2}],"currency":"RUB","amount":900}"#)
            .expect("an order");
    let placement = Placement {
        principal: "old-principal",
        operation_id: Uuid::new_v4(),
        charge_id: None,
        client_order_id: Some("ORD-1"),
    };
    let inserted = db.insert(placement, &new).await.expect("insert");
    let found = db
        .get_by_client_id("old-principal", "ORD-1")
        .await
        .expect("get by client id");
    assert_eq!(found.as_ref(), Some(&inserted), "{release}");
    let change = OrderChange {
        note: Some("ring twice".to_owned()),
        ..old.change()
    };
    let edited = db
        .on_connection(async |conn| {
            let first = conn
                .update_if_version("old-principal", old.order_id, 1, &change)
                .await?;
            let stale = conn
                .update_if_version("old-principal", old.order_id, 1, &change)
                .await?;
            Ok((first, stale))
        })
        .await
        .expect("edit");
    assert_eq!(edited, (true, false), "{release}: one edit per version");
    let account = db
        .on_connection(async |conn| {
            ledger::open(conn, "old-principal", Uuid::new_v4(), 500, "RUB").await
        })
        .await
        .expect("open an account");
    let (account, opened) = account;
    assert_eq!(
        (account.balance, account.version, opened),
        (500, 1, true),
        "{release}"
    );
    // What an operation answered: recorded once (a second record of the same
    // operation keeps the first), found only by its principal, purged by age.
    let operation = Uuid::new_v4();
    let answer = Outcome {
        status: axum::http::StatusCode::OK,
        body: r#"{"order_id":1}"#.to_owned(),
    };
    let retention = Duration::from_secs(60);
    let (found, foreign, kept, purged, gone) = db
        .on_connection(async |conn| {
            outcome::record(conn, operation, "old-principal", &answer, retention).await?;
            let other = Outcome {
                status: axum::http::StatusCode::CREATED,
                body: "{}".to_owned(),
            };
            outcome::record(conn, operation, "old-principal", &other, retention).await?;
            let found = outcome::find(conn, operation, "old-principal").await?;
            let foreign = outcome::find(conn, operation, "another-principal").await?;
            let kept = outcome::purge(conn, 0).await?;
            let purged = outcome::purge(conn, i64::MAX).await?;
            let gone = outcome::find(conn, operation, "old-principal").await?;
            Ok((found, foreign, kept, purged, gone))
        })
        .await
        .expect("operation outcomes");
    assert_eq!(found, Some(answer), "{release}");
    assert_eq!(foreign, None, "{release}");
    assert_eq!((kept, purged), (0, 1), "{release}: only what is older goes");
    assert_eq!(gone, None, "{release}");
    let applied = |db: OrdersDb| async move {
        db.on_connection(async |conn| {
            on_dialect!(
                conn,
                sqlx::query_scalar,
                Dialects {
                    sqlite: "SELECT version FROM orders_migrations ORDER BY version",
                    postgres: "SELECT version FROM orders_migrations ORDER BY version",
                },
                |query, on| query.fetch_all(on).await
            )
        })
        .await
        .expect("the migrations table")
    };
    let versions: Vec<i64> = applied(db.clone()).await;
    // Every migration of the dialect, whichever release the database came from.
    let embedded: Vec<i64> = match url {
        DatabaseUrl::Sqlite(_) => sqlx::migrate!("migrations/orders/sqlite"),
        DatabaseUrl::Postgres(_) => sqlx::migrate!("migrations/orders/postgres"),
    }
    .iter()
    .map(|migration| migration.version)
    .collect();
    assert!(embedded.len() >= 4, "{embedded:?}");
    assert_eq!(versions, embedded, "{release}");
    db.close().await;
    let again = OrdersDb::open(url, TIMEOUT).await.expect("opened again");
    assert_eq!(applied(again.clone()).await, versions, "{release}");
    assert_eq!(again.list("old-principal").await.expect("list").len(), 2);
    again.close().await;
}

/// A directory of its own, removed at the end.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = Self(std::env::temp_dir().join(format!("idemgate-orders-{}", Uuid::new_v4())));
        std::fs::create_dir_all(&dir.0).expect("temp dir");
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_sqlite_database_of_each_earlier_release_opens() {
    for (release, statements) in SQLITE.each() {
        let dir = TempDir::new();
        let url = format!("sqlite://{}", dir.0.join("orders.db").display());
        opens_and_works(&DatabaseUrl::Sqlite(url), release, statements).await;
    }
}

#[tokio::test]
async fn a_postgres_database_of_each_earlier_release_opens() {
    let server = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let admin = connect_postgres(&server, TIMEOUT)
        .await
        .unwrap_or_else(|error| {
            panic!(
                "PostgreSQL at {server} is unreachable ({error}): start it with \
             `scripts/services.sh postgres` or set IDEMGATE_TEST_POSTGRES_URL"
            )
        });
    for (release, statements) in POSTGRES.each() {
        // A schema of its own, first on the search path of every connection.
        let schema = format!("idemgate_orders_{}", Uuid::new_v4().simple());
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await
            .expect("create schema");
        let separator = if server.contains('?') { '&' } else { '?' };
        let url = format!("{server}{separator}options=-c%20search_path%3D{schema}");
        opens_and_works(&DatabaseUrl::Postgres(url), release, statements).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&admin)
            .await
            .expect("drop schema");
    }
}

/// A write on PostgreSQL whose server stops answering after its `BEGIN` (a
/// freezing tap between the pool and the server) is cut at the store timeout:
/// `bounded` answers `TimedOut` in that time (the handlers' 503), where the
/// statement alone would wait for the thaw. Once the server answers again the
/// pool's one connection is back outside any transaction: dropping the write
/// rolled it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_a_frozen_postgres_is_cut_at_the_store_timeout() {
    let server = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let options: sqlx::postgres::PgConnectOptions = server.parse().expect("url");
    let tap = idemgate_testkit::tap::Tap::start_to(options.get_host(), options.get_port()).await;
    let url = format!(
        "postgres://{}@{}/{}",
        options.get_username(),
        tap.addr(),
        options.get_database().unwrap_or("test")
    );
    let store_timeout = Duration::from_millis(500);
    let db = OrdersDb::Postgres(
        connect_postgres(&url, store_timeout)
            .await
            .expect("connect"),
    );
    let OrdersDb::Postgres(pool) = &db else {
        unreachable!("a PostgreSQL database")
    };
    let started = std::time::Instant::now();
    let write = db.bounded(async {
        let mut tx = idemgate_sqlx::begin_to_the_end(pool, None)
            .await
            .expect("BEGIN while it answers");
        tap.freeze();
        sqlx::query("SELECT 1").execute(&mut *tx).await.map(drop)
    });
    let cut = tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .expect("the write held past 10 s on a frozen server");
    let took = started.elapsed();
    assert!(
        matches!(cut, Err(TimedOut(timeout)) if timeout == store_timeout),
        "{cut:?}"
    );
    assert!(took < store_timeout * 4, "cut after {took:?}");
    tap.thaw();
    idemgate_testkit::wait::wait_until(
        "the connection back in the pool",
        Duration::from_secs(5),
        || pool.num_idle() > 0,
    )
    .await;
    assert_eq!(pool.size(), 1, "the one connection the write used");
    // In the transaction the write left open, `now()` would stay its `BEGIN`.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let inside_an_old_transaction: bool =
        sqlx::query_scalar("SELECT clock_timestamp() - now() > interval '100 milliseconds'")
            .fetch_one(pool)
            .await
            .expect("a statement after the thaw");
    assert!(
        !inside_an_old_transaction,
        "the cut write's transaction stayed open"
    );
}

/// This process's writes to the orders' SQLite file take turns
/// ([`SqliteOrders`]). Opened with no busy timeout at all, so that a write
/// finding the lock taken fails at once (`SQLITE_BUSY`) where it would
/// otherwise sleep in SQLite's busy handler, thirty-two writers released
/// together — orders inserted on their own and orders inserted in `IMMEDIATE`
/// transactions — all commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sqlite_writes_take_turns_instead_of_meeting_the_lock() {
    const WRITERS: usize = 32;
    let dir = TempDir::new();
    let db = SqliteOrders::new(without_busy_timeout(&dir).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let writers = (0..WRITERS).map(|writer| {
        let (db, barrier) = (db.clone(), Arc::clone(&barrier));
        tokio::spawn(async move {
            barrier.wait().await;
            write_an_order(&db, writer % 2 == 0).await
        })
    });
    for written in futures_util::future::join_all(writers).await {
        written
            .expect("a writer task")
            .expect("a write in its turn");
    }
    let orders = OrdersDb::Sqlite(db).list("p").await.expect("list");
    assert_eq!(orders.len(), WRITERS, "every writer's order committed");
}

/// When the idempotency records share the file, the orders' writes queue on
/// the store's writer ([`SqliteOrders::writing_through`]): released together
/// with the store's own claims, on a file with no busy timeout, every one
/// commits. With the process's turn instead, the orders and the store's
/// writer meet at SQLite's lock and some fail at once (`database is locked`);
/// with a busy timeout they would sleep there instead, and a keyless order
/// beside a stream of keyed ones starved (docs/benchmarks.md, "Keyless and
/// keyed orders on one file").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_and_claims_on_one_file_queue_on_the_stores_writer() {
    use idemgate::{Claim, Store};

    const WRITERS: usize = 48;
    let dir = TempDir::new();
    let pool = without_busy_timeout(&dir).await;
    let store = idemgate_sqlite::SqliteStore::new(pool.clone());
    store.migrate().await.expect("the store's tables");
    let db = SqliteOrders::new(pool).writing_through(store.clone());
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let writers = (0..WRITERS).map(|writer| {
        let (db, store, barrier) = (db.clone(), store.clone(), Arc::clone(&barrier));
        tokio::spawn(async move {
            barrier.wait().await;
            match writer % 3 {
                0 | 1 => write_an_order(&db, writer % 3 == 0)
                    .await
                    .map_err(|error| error.to_string()),
                _ => match store
                    .try_claim(&idemgate_testkit::fixtures::fresh_request())
                    .await
                {
                    Ok(Claim::Acquired(_)) => Ok(()),
                    other => Err(format!("a new key's claim: {other:?}")),
                },
            }
        })
    });
    for written in futures_util::future::join_all(writers).await {
        written
            .expect("a writer task")
            .expect("a write on the store's writer");
    }
    let orders = OrdersDb::Sqlite(db).list("p").await.expect("list");
    assert_eq!(orders.len(), WRITERS / 3 * 2, "every order committed");
    assert_eq!(
        store.writer_stats().operations as usize,
        WRITERS,
        "the claims and the orders' writes went through the store's writer"
    );
}

/// The orders' file in `dir`, created and migrated as a starting server
/// does, then opened again with no busy timeout: a write that finds SQLite's
/// lock taken fails at once (`SQLITE_BUSY`) instead of sleeping in the busy
/// handler.
async fn without_busy_timeout(dir: &TempDir) -> SqlitePool {
    let url = format!("sqlite://{}", dir.0.join("orders.db").display());
    OrdersDb::open(&DatabaseUrl::Sqlite(url.clone()), TIMEOUT)
        .await
        .expect("open")
        .close()
        .await;
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .acquire_timeout(TIMEOUT)
        .connect_with(
            idemgate_sqlite::SqliteStore::connect_options(crate::database::sqlite_path(&url))
                .busy_timeout(Duration::ZERO),
        )
        .await
        .expect("pool")
}

/// One order of principal `p`, inserted on its own (`alone`) or in a write
/// transaction of its own, committed.
async fn write_an_order(db: &SqliteOrders, alone: bool) -> Result<(), sqlx::Error> {
    let order =
        NewOrder::parse(br#"{"items":[{"id":7,"quantity":1}],"currency":"RUB","amount":900}"#)
            .expect("an order");
    let placement = Placement {
        principal: "p",
        operation_id: Uuid::new_v4(),
        charge_id: None,
        client_order_id: None,
    };
    if alone {
        db.insert(placement, &order).await.map(drop)
    } else {
        let mut tx = db.begin_immediate().await?;
        insert_sqlite(&mut tx, placement, &order).await?;
        tx.commit().await
    }
}
