//! What a completed record costs each store: bytes on disk (SQLite, PostgreSQL)
//! or in memory (Redis) per record, measured, for the capacity guide
//! (`docs/deploy.md`, "Storage per million records").
//!
//! ```sh
//! cargo run --release -p idemgate-bench --example storage              # 100,000 records per store
//! cargo run --release -p idemgate-bench --example storage -- 400000 sqlite redis
//! ```
//!
//! Per store it claims and completes `N` fresh records (32 tasks at once, as the
//! proxy does them: a UUID key, a 64-hex principal, `POST /orders`, a 201 with
//! `Content-Type` and `Location` and a 256-byte JSON order), reading the store's
//! size at 0, `N/2` and `N`. The bytes per record are the slope between `N/2`
//! and `N` — what one more record adds once the fixed costs (empty files, the
//! schema, Redis's own baseline) are paid — and a million records are that slope
//! times 10^6. Sizes:
//! - SQLite: the database file after `PRAGMA wal_checkpoint(TRUNCATE)`;
//! - PostgreSQL: `pg_total_relation_size` of `idemgate_records` (heap, TOAST and
//!   both indexes) as the run left it — each completion is an `UPDATE`, so dead
//!   row versions are in it until vacuum reuses their space — and after `VACUUM
//!   FULL`, the live floor; on a database of its own, dropped afterwards;
//! - Redis: `used_memory` of `INFO memory`, on a `redis-server` of this run's own
//!   (a free port, AOF on as in production), stopped afterwards by its PID.
//!
//! PostgreSQL: `IDEMGATE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) names the server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use idemgate_core::fingerprint::Fingerprint;
use idemgate_core::key::IdempotencyKey;
use idemgate_core::record::{StoredBody, StoredResponse};
use idemgate_core::scope::{Identity, Principal, Scope};
use idemgate_core::{Claim, ClaimRequest, Completion, FencedWrite, FinalStatus, Store};

/// Claims at once, as a loaded proxy has them.
const TASKS: usize = 32;
/// How long the records live: longer than the run, so none expires in it.
const TTL: Duration = Duration::from_secs(86_400);

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let records: usize = match args.next() {
        Some(n) => n.parse()?,
        None => 100_000,
    };
    let mut stores: Vec<String> = args.collect();
    if stores.is_empty() {
        stores = ["sqlite", "postgres", "redis"].map(String::from).to_vec();
    }
    println!(
        "{records} records per store, {TASKS} at once; a 201 with a {}-byte body",
        order_body(0).len()
    );
    println!(
        "| store | size at 0 | at N/2 | at N | bytes per record (N/2 → N) | per million records |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for store in stores {
        match store.as_str() {
            "sqlite" => sqlite(records).await?,
            "postgres" => postgres(records).await?,
            "redis" => redis(records).await?,
            other => {
                return Err(format!("unknown store {other:?}: sqlite, postgres or redis").into());
            }
        }
    }
    Ok(())
}

async fn sqlite(records: usize) -> Result<(), Error> {
    let dir = TempDir::new("idemgate-storage-sqlite")?;
    let file = dir.0.join("records.db");
    let store = Arc::new(idemgate_sqlite::SqliteStore::open(&file).await?);
    let size = |store: Arc<idemgate_sqlite::SqliteStore>, file: PathBuf| async move {
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(store.pool())
            .await?;
        Ok::<u64, Error>(std::fs::metadata(&file)?.len())
    };
    let sizes = measure(records, store.clone(), || size(store.clone(), file.clone())).await?;
    report("SQLite (file)", records, sizes);
    Ok(())
}

async fn postgres(records: usize) -> Result<(), Error> {
    let server = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let name = format!("idemgate_storage_{}", uuid::Uuid::new_v4().simple());
    let admin = sqlx::PgPool::connect(&server).await?;
    // `name` is this run's own: letters, digits and underscores.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await?;
    let url = match server.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => return Err(format!("no database in {server}").into()),
    };
    let result = async {
        let store = Arc::new(idemgate_postgres::PostgresStore::connect(&url).await?);
        let size = |store: Arc<idemgate_postgres::PostgresStore>| async move {
            let (bytes,): (i64,) =
                sqlx::query_as("SELECT pg_total_relation_size('idemgate_records')")
                    .fetch_one(store.pool())
                    .await?;
            Ok::<u64, Error>(u64::try_from(bytes)?)
        };
        let sizes = measure(records, store.clone(), || size(store.clone())).await?;
        report("PostgreSQL (as run)", records, sizes);
        sqlx::query("VACUUM FULL idemgate_records")
            .execute(store.pool())
            .await?;
        let floor = size(store.clone()).await?;
        println!(
            "| PostgreSQL (after VACUUM FULL) | | | {} | {:.0} (N's size / N) | {} |",
            mib(floor),
            floor as f64 / records as f64,
            mib((floor as f64 / records as f64 * 1e6) as u64)
        );
        store.pool().close().await;
        Ok::<(), Error>(())
    }
    .await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await?;
    result
}

async fn redis(records: usize) -> Result<(), Error> {
    let dir = TempDir::new("idemgate-storage-redis")?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let server = OwnRedis(
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--appendonly", "yes", "--save", ""])
            .arg("--dir")
            .arg(&dir.0)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|error| format!("redis-server did not start: {error}"))?,
    );
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut connection = loop {
        match client.get_multiplexed_async_connection().await {
            Ok(connection) => break connection,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => return Err(error.into()),
        }
    };
    let store = Arc::new(idemgate_redis::RedisStore::connect(&url).await?);
    let size = || {
        let mut connection = connection.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut connection)
                .await?;
            let used = info
                .lines()
                .find_map(|line| line.strip_prefix("used_memory:"))
                .ok_or("INFO memory has no used_memory")?;
            Ok::<u64, Error>(used.trim().parse()?)
        }
    };
    let sizes = measure(records, store, size).await?;
    report("Redis (used_memory)", records, sizes);
    let _: () = redis::cmd("SHUTDOWN")
        .arg("NOSAVE")
        .query_async(&mut connection)
        .await
        .or_else(
            // The server closes the connection as it stops.
            |error: redis::RedisError| {
                if error.is_io_error() || error.is_connection_dropped() {
                    Ok(())
                } else {
                    Err(error)
                }
            },
        )?;
    drop(server);
    Ok(())
}

/// Sizes at 0, N/2 and N records.
async fn measure<S, F, Fut>(records: usize, store: Arc<S>, size: F) -> Result<[u64; 3], Error>
where
    S: Store,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<u64, Error>>,
{
    let empty = size().await?;
    fill(&store, records / 2).await?;
    let half = size().await?;
    fill(&store, records - records / 2).await?;
    let full = size().await?;
    Ok([empty, half, full])
}

/// Claims and completes `count` fresh records, `TASKS` at a time.
async fn fill<S: Store>(store: &Arc<S>, count: usize) -> Result<(), Error> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = Arc::clone(store);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < count {
                let request = fresh_request();
                let Claim::Acquired(lease) = store.try_claim(&request).await? else {
                    return Err::<(), Error>("a fresh key found a record".into());
                };
                let completion = Completion {
                    status: FinalStatus::Completed,
                    response: created(),
                    ttl: TTL,
                };
                if !matches!(
                    store.complete(&lease, &completion).await?,
                    FencedWrite::Applied
                ) {
                    return Err("a completion was fenced off".into());
                }
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// What the proxy claims for a new key: a 64-hex principal (the HMAC of an
/// `Authorization` value), `POST /orders`, a UUID key, a SHA-256 fingerprint.
fn fresh_request() -> ClaimRequest {
    let principal = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let key = uuid::Uuid::new_v4().to_string();
    let scope = Scope {
        principal: Principal::new(principal),
        method: "POST".into(),
        path: "/orders".into(),
    };
    ClaimRequest {
        identity: Identity::new(
            scope,
            IdempotencyKey::parse(key.as_bytes(), 255).expect("a UUID is a key"),
        ),
        fingerprint: Fingerprint::from_bytes(
            *uuid::Uuid::new_v4()
                .as_bytes()
                .repeat(2)
                .first_chunk()
                .expect("32 bytes"),
        ),
        field_digests: None,
        lease: Duration::from_secs(30),
        ttl: TTL,
        route_template: None,
    }
}

/// A 201 as an orders API answers it.
fn created() -> StoredResponse {
    let id = 1_000_000 + u64::from(uuid::Uuid::new_v4().as_fields().0 % 1_000_000);
    StoredResponse {
        trailers: Vec::new(),
        status: StatusCode::CREATED,
        headers: vec![
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
            (
                HeaderName::from_static("location"),
                HeaderValue::try_from(format!("/orders/{id}")).expect("ASCII"),
            ),
        ],
        body: StoredBody::Retained(Bytes::from(order_body(id))),
    }
}

/// A 256-byte order document.
fn order_body(id: u64) -> String {
    let mut body = format!(
        r#"{{"id":{id:07},"status":"paid","currency":"RUB","amount":1500,"items":[{{"id":42,"quantity":1,"price":1500}}],"customer":"c-0042","created_at":"2026-12-01T12:00:00.000Z","payment":{{"charge_id":"ch_{:032x}"}},"note":""#,
        u128::from(id)
    );
    while body.len() < 254 {
        body.push('x');
    }
    body.push_str(r#""}"#);
    body
}

fn report(store: &str, records: usize, [empty, half, full]: [u64; 3]) {
    let per_record = (full as f64 - half as f64) / (records - records / 2) as f64;
    println!(
        "| {store} | {} | {} | {} | {per_record:.0} | {} |",
        mib(empty),
        mib(half),
        mib(full),
        mib((per_record * 1e6) as u64)
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A directory of this run's, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Result<TempDir, Error> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(Path::new(&self.0));
    }
}

/// The run's own Redis, killed by its PID if it is still running.
struct OwnRedis(Child);

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
