//! Store ceilings: what Redis and PostgreSQL do with the store's own claim (and
//! completion) statements when nothing else is in the way, measured with their own
//! load tools at the same connection count as the HTTP runs.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, StatusCode};
use idemgate_core::record::{StoredBody, StoredResponse};
use serde::{Deserialize, Serialize};
use tokio::process::Command;

use crate::BoxError;
use crate::store::StoreProcesses;

/// One tool's measurement of a store's ceiling.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ceiling {
    /// `redis` or `postgres`.
    pub(crate) store: String,
    /// What one operation of the ceiling is.
    pub(crate) operation: String,
    /// The command that measured it.
    pub(crate) command: String,
    /// Operations per second.
    pub(crate) ops_per_sec: f64,
    /// The store's own CPU time per operation while the tool ran (Redis's
    /// process, or the PostgreSQL backends of the bench database).
    #[serde(default)]
    pub(crate) store_cpu_us_per_op: Option<f64>,
    /// Checks made on the way (script identity, rows completed).
    pub(crate) notes: Vec<String>,
}

/// The source of the Redis store's scripts, read at compile time so the ceiling
/// runs exactly the claim script the store runs (a change there changes the SHA,
/// and the check below notices a mismatch with the server's).
const REDIS_SCRIPTS_SOURCE: &str = include_str!("../../idemgate-redis/src/scripts.rs");

/// The text of a `const NAME: &str = r"…";` in the scripts' source.
fn raw_const<'a>(source: &'a str, name: &str) -> Result<&'a str, BoxError> {
    let marker = format!("const {name}: &str = r\"");
    let start = source
        .find(&marker)
        .ok_or_else(|| format!("no `{marker}` in idemgate-redis/src/scripts.rs"))?
        + marker.len();
    let len = source[start..]
        .find('"')
        .ok_or_else(|| format!("unterminated {name} in idemgate-redis/src/scripts.rs"))?;
    Ok(&source[start..start + len])
}

/// The claim script exactly as `RedisStore` loads it: the prelude, then the body.
pub(crate) fn redis_claim_script() -> Result<String, BoxError> {
    let prelude = raw_const(REDIS_SCRIPTS_SOURCE, "PRELUDE")?;
    let claim = raw_const(REDIS_SCRIPTS_SOURCE, "CLAIM")?;
    Ok(format!("{prelude}{claim}"))
}

async fn output(command: &mut Command) -> Result<String, BoxError> {
    let out = command.output().await?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command` to completion while sampling `store`'s CPU time from 1 s after
/// its start to 1 s before `duration` has passed; returns its output and that
/// CPU time per second of wall time.
async fn output_sampling(
    command: &mut Command,
    store: &StoreProcesses,
    duration: Duration,
) -> Result<(String, Option<f64>), BoxError> {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let sampling = async {
        let margin = Duration::from_secs(1);
        if duration <= margin * 3 {
            return None;
        }
        tokio::time::sleep(margin).await;
        let (started, start) = (Instant::now(), store.sample());
        tokio::time::sleep(duration - margin * 2).await;
        let (ended, end) = (Instant::now(), store.sample());
        let spent = StoreProcesses::spent(&start, &end);
        (!end.is_empty()).then(|| spent.as_secs_f64() / ended.duration_since(started).as_secs_f64())
    };
    let (out, cpu_per_second) = tokio::join!(child.wait_with_output(), sampling);
    let out = out?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        cpu_per_second,
    ))
}

/// `redis-benchmark` running `EVALSHA <claim> 1 <fresh key> …` on new keys at
/// `connections` connections for about `duration`.
pub(crate) async fn redis(
    url: &str,
    connections: usize,
    duration: Duration,
    redis: &StoreProcesses,
) -> Result<Ceiling, BoxError> {
    let script = redis_claim_script()?;
    let sha = sha1_smol::Sha1::from(&script).digest().to_string();
    let mut notes = Vec::new();
    // The server runs its scripts by SHA, loading them on first use: if the store's
    // runs happened before this, Redis knows this SHA only if our text is theirs.
    let exists =
        output(Command::new("redis-cli").args(["-u", url, "SCRIPT", "EXISTS", &sha])).await?;
    notes.push(if exists.trim() == "1" {
        format!("claim script {sha}: already in Redis's script cache, loaded by the idemgate server: the same script")
    } else {
        format!("claim script {sha}: not yet in Redis's script cache (no Redis run before, or a SCRIPT FLUSH)")
    });
    let loaded =
        output(Command::new("redis-cli").args(["-u", url, "SCRIPT", "LOAD", &script])).await?;
    if loaded.trim() != sha {
        return Err(format!("SCRIPT LOAD answered {loaded:?}, expected {sha}").into());
    }
    // 32-byte fingerprint, 16-byte operation id, 30 s lease, 15 min TTL (the
    // records expire by themselves), format version 1, no field digests — the
    // store's arguments.
    let args = |n: u64| -> Vec<String> {
        [
            "-u",
            url,
            "-c",
            &connections.to_string(),
            "-n",
            &n.to_string(),
            "-r",
            "1000000000000",
            "--csv",
            "EVALSHA",
            &sha,
            "1",
            "idemgate-bench:ceiling:{__rand_int__}",
            "fingerprint-of-thirty-two-bytes!",
            "operation-id-16b",
            "30000",
            "900000",
            "1",
            // No field digests (a body without them): the store sends an empty
            // string, and the script writes no `fd` field.
            "",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let rps = |csv: &str| -> Result<f64, BoxError> {
        let line = csv
            .lines()
            .find(|line| line.starts_with("\"EVALSHA"))
            .ok_or_else(|| format!("no EVALSHA line in redis-benchmark output: {csv}"))?;
        let field = line
            .split("\",\"")
            .nth(1)
            .ok_or("short redis-benchmark csv line")?;
        Ok(field.trim_matches('"').parse()?)
    };
    // Calibrate, then run for about `duration`.
    let probe = rps(&output(Command::new("redis-benchmark").args(args(20_000))).await?)?;
    let n = ((probe * duration.as_secs_f64()) as u64).max(20_000);
    let argv = args(n);
    let (csv, cpu_per_second) =
        output_sampling(Command::new("redis-benchmark").args(&argv), redis, duration).await?;
    let measured = rps(&csv)?;
    notes.push(format!(
        "{n} claims of fresh keys (each answers `N`: a new record)"
    ));
    Ok(Ceiling {
        store: "redis".to_owned(),
        operation: "claim (1 EVALSHA)".to_owned(),
        command: format!("redis-benchmark {}", shell_words(&argv)),
        ops_per_sec: measured,
        store_cpu_us_per_op: cpu_per_second.map(|cpu| cpu * 1e6 / measured),
        notes,
    })
}

/// A stored response like the orders service's 201, as the completion writes it.
fn sample_response() -> StoredResponse {
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
                HeaderValue::from_static("/api/v1/orders/123456"),
            ),
        ],
        body: StoredBody::Retained(
            br#"{"amount":1500,"currency":"RUB","order_id":123456,"status":"paid"}"#
                .as_slice()
                .into(),
        ),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The pgbench script: the store's claim statement on a fresh identity, then its
/// fenced completion of that claim, each in its own transaction, as
/// `PostgresStore::try_claim` and `complete` run them (mirrors
/// `crates/idemgate-postgres/src/sql.rs`: only the `INSERT` branch runs for new
/// keys; the `ON CONFLICT` branch is kept so the statement is the same). pgbench
/// computes the identity in SQL (`sha256`) where the store sends it as a parameter.
fn pgbench_script() -> String {
    let response = sample_response();
    let headers = hex(&response.encode_fields());
    let body = match &response.body {
        StoredBody::Retained(body) => hex(body),
        StoredBody::NotRetained | StoredBody::InPieces(_) => String::new(),
    };
    let expired = "r.expires_at <= EXCLUDED.created_at";
    let ms = |e: &str| format!("floor(extract(epoch FROM {e}) * 1000)::bigint");
    format!(
        r#"\set r random(1, 1000000000000)
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
INSERT INTO "idemgate_records" AS r (identity, principal, method, path, idempotency_key,
    fingerprint, format_version, operation_id, token, status, lease_origin,
    locked_until, created_at, expires_at)
SELECT sha256(int8send(:r::bigint) || int4send(:client_id::int)), 'bearer-pgbench', 'POST', '/api/v1/orders',
    :r::text, sha256('fingerprint'::bytea), 1, gen_random_uuid(),
    nextval('"idemgate_records_token_seq"'), 'PROCESSING', 'NEW',
    now.t + 30000 * interval '1 millisecond', now.t, now.t + 900000 * interval '1 millisecond'
FROM now
ON CONFLICT (identity) DO UPDATE SET
    fingerprint = EXCLUDED.fingerprint,
    format_version = CASE WHEN {expired} THEN EXCLUDED.format_version ELSE r.format_version END,
    operation_id = CASE WHEN {expired} THEN EXCLUDED.operation_id ELSE r.operation_id END,
    token = EXCLUDED.token,
    status = 'PROCESSING',
    lease_origin = CASE WHEN {expired} THEN 'NEW' WHEN r.status = 'RELEASED' THEN 'RELEASED' ELSE 'TAKEN_OVER' END,
    locked_until = EXCLUDED.locked_until,
    response_status = NULL, response_headers = NULL, response_body = NULL, body_retained = NULL,
    created_at = CASE WHEN {expired} THEN EXCLUDED.created_at ELSE r.created_at END,
    expires_at = CASE WHEN {expired} THEN EXCLUDED.expires_at ELSE GREATEST(r.expires_at, EXCLUDED.expires_at) END
WHERE {expired}
   OR (r.fingerprint = EXCLUDED.fingerprint AND (r.status = 'RELEASED'
       OR (r.status = 'PROCESSING' AND (r.locked_until IS NULL OR r.locked_until <= EXCLUDED.created_at))))
RETURNING r.operation_id AS op, r.token AS tk, r.lease_origin AS origin, {locked_until} AS lu
\gset
UPDATE "idemgate_records" SET status = 'COMPLETED', locked_until = NULL, response_status = 201,
    response_headers = '\x{headers}'::bytea, response_body = '\x{body}'::bytea, body_retained = true,
    expires_at = clock_timestamp() + 900000 * interval '1 millisecond'
WHERE identity = sha256(int8send(:r::bigint) || int4send(:client_id::int)) AND operation_id = :op::uuid AND token = :tk::bigint
    AND status = 'PROCESSING' AND expires_at > clock_timestamp();
"#,
        locked_until = ms("r.locked_until"),
    )
}

/// `pgbench` running the claim + completion script against `db_url` (a database
/// the store migrated) at `connections` clients for `duration`.
pub(crate) async fn postgres(
    db_url: &str,
    connections: usize,
    duration: Duration,
    scratch: &Path,
    backends: &StoreProcesses,
) -> Result<Ceiling, BoxError> {
    let script_path = scratch.join("claim-complete.pgbench.sql");
    std::fs::write(&script_path, pgbench_script())?;
    let argv: Vec<String> = [
        "-n",
        "-M",
        "prepared",
        "-c",
        &connections.to_string(),
        "-j",
        "2",
        "-T",
        &duration.as_secs().max(1).to_string(),
        "-f",
        &script_path.display().to_string(),
        db_url,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let (out, cpu_per_second) =
        output_sampling(Command::new("pgbench").args(&argv), backends, duration).await?;
    let tps = out
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| format!("no tps line in pgbench output: {out}"))?
        .parse::<f64>()?;
    let counts = output(Command::new("psql").args([
        db_url,
        "-Atc",
        "SELECT count(*) FILTER (WHERE status = 'COMPLETED'), count(*) FROM idemgate_records",
    ]))
    .await?;
    Ok(Ceiling {
        store: "postgres".to_owned(),
        operation: "claim + fenced completion (2 statements, 2 commits)".to_owned(),
        command: format!("pgbench {}", shell_words(&argv)),
        ops_per_sec: tps,
        store_cpu_us_per_op: cpu_per_second.map(|cpu| cpu * 1e6 / tps),
        notes: vec![format!(
            "records completed / written: {} (every completion passed its fence)",
            counts.trim().replace('|', " / ")
        )],
    })
}

/// Arguments joined for display, quoted where the shell would need it.
pub(crate) fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| {
            // An empty argument must stay one: `''`.
            if !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,".contains(c))
            {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_script_is_found_in_the_store_source() {
        let script = redis_claim_script().unwrap();
        assert!(script.contains("local function now_ms()"), "{script}");
        assert!(script.contains("redis.call('HGETALL', key)"), "{script}");
        assert!(script.contains("return {'E'"), "{script}");
    }

    #[test]
    fn the_pgbench_script_sets_and_uses_the_claim() {
        let script = pgbench_script();
        // pgbench turns every `:name` into a parameter, inside string literals too.
        for literal in script.split('\'').skip(1).step_by(2) {
            assert!(!literal.contains(':'), "colon in literal {literal:?}");
        }
        assert!(script.contains("\\gset"));
        assert!(script.contains("operation_id = :op::uuid AND token = :tk::bigint"));
    }

    /// The printed command runs as it ran: an empty argument (the claim's
    /// absent field digests) stays an argument, quoted words stay whole.
    #[test]
    fn printed_commands_keep_empty_and_spaced_arguments() {
        let argv: Vec<String> = ["EVALSHA", "", "a b", "it's", "x:1"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(shell_words(&argv), r"EVALSHA '' 'a b' 'it'\''s' x:1");
    }
}
