//! Property tests of the command line (`idemgate serve`): whatever an operator
//! types, parsing answers a setting or an error naming the flag and its variable —
//! never a panic, never a setting the service cannot run with.

use std::time::Duration;

use clap::Parser;
use idemgate_server::cli::{Cli, Command};
use idemgate_server::cmd::serve::{RecordStore, ServeSettings};
use idemgate_server::config::{ConfigError, DatabaseUrl, StoreUrl};
use proptest::prelude::*;

/// Parses `serve` with `flags`; `None` when clap itself refuses the command line
/// (a malformed number, say), which it reports with its own usage message.
fn serve(flags: &[(&str, String)]) -> Option<Result<ServeSettings, ConfigError>> {
    let mut argv = vec!["idemgate".to_owned(), "serve".to_owned()];
    for (flag, value) in flags {
        argv.push(format!("--{flag}={value}"));
    }
    let Command::Serve(args) = Cli::try_parse_from(argv).ok()?.command else {
        panic!("`serve` parses as serve");
    };
    Some(ServeSettings::from_args(&args))
}

/// Text an operator might put in a URL-ish flag: real prefixes, junk, and anything.
fn url_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "(sqlite|postgres|postgresql|redis|rediss|http|https|mysql|)(://|:)[ -~]{0,30}",
        "(database|memory|DATABASE|Memory| memory)",
        any::<String>().prop_filter("clap reads a leading '-' as a flag", |s| {
            !s.starts_with('-') && !s.contains('\0')
        }),
    ]
}

fn names_flag_and_variable(error: &ConfigError) -> bool {
    let text = error.to_string();
    text.contains(error.flag) && text.contains(error.env) && error.flag.starts_with("--")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn store_and_database_urls_are_classified_or_refused_by_name(
        database in url_like(),
        store in url_like(),
        gateway in url_like(),
    ) {
        let Some(result) = serve(&[
            ("database", database.clone()),
            ("idempotency-store", store.clone()),
            ("gateway-url", gateway.clone()),
        ]) else {
            return Ok(());
        };
        match result {
            Ok(settings) => {
                match &settings.database {
                    DatabaseUrl::Sqlite(url) => prop_assert!(url.starts_with("sqlite:")),
                    DatabaseUrl::Postgres(url) => prop_assert!(
                        url.starts_with("postgres://") || url.starts_with("postgresql://")
                    ),
                }
                match &settings.idempotency_store {
                    RecordStore::OrdersDatabase => prop_assert_eq!(store.as_str(), "database"),
                    RecordStore::Separate(StoreUrl::Memory) => prop_assert_eq!(store.as_str(), "memory"),
                    RecordStore::Separate(StoreUrl::Redis(url)) => prop_assert!(
                        url.starts_with("redis://") || url.starts_with("rediss://")
                    ),
                    RecordStore::Separate(other) => prop_assert!(false, "serve accepted {other:?}"),
                }
                let url = settings.gateway_url.expect("a gateway URL was given");
                prop_assert!(matches!(url.scheme(), "http" | "https"));
            }
            Err(error) => prop_assert!(names_flag_and_variable(&error), "{error}"),
        }
    }

    #[test]
    fn durations_are_accepted_exactly_when_the_service_can_run_with_them(
        ttl in prop_oneof![Just(0u64), 1u64..100, any::<u64>()],
        lease in prop_oneof![Just(0u64), 1u64..100, any::<u64>()],
        wait_ms in prop_oneof![Just(0u64), any::<u64>()],
        gateway_timeout_ms in prop_oneof![Just(0u64), 1u64..100_000],
        header_ms in prop_oneof![Just(0u64), 1u64..100_000],
        body_ms in prop_oneof![Just(0u64), 1u64..100_000],
        idle_ms in prop_oneof![Just(0u64), 1u64..100_000],
        max_connections in prop_oneof![Just(0usize), 1usize..100_000],
    ) {
        let result = serve(&[
            ("database", "sqlite://./never-opened.db".to_owned()),
            ("idempotency-store", "memory".to_owned()),
            ("ttl", ttl.to_string()),
            ("lease", lease.to_string()),
            ("wait-ms", wait_ms.to_string()),
            ("gateway-timeout-ms", gateway_timeout_ms.to_string()),
            ("header-read-timeout-ms", header_ms.to_string()),
            ("body-read-timeout-ms", body_ms.to_string()),
            ("idle-timeout-ms", idle_ms.to_string()),
            ("max-connections", max_connections.to_string()),
        ])
        .expect("numbers in range always parse");
        let runnable = lease >= 1
            && ttl > lease
            && gateway_timeout_ms >= 1
            && header_ms >= 1
            && body_ms >= 1
            && idle_ms >= 1
            && max_connections >= 1;
        match result {
            Ok(settings) => {
                prop_assert!(runnable, "accepted ttl={ttl} lease={lease}");
                prop_assert!(settings.layer.ttl > settings.layer.lease);
                prop_assert!(settings.layer.lease >= Duration::from_secs(1));
                prop_assert_eq!(settings.layer.wait, (wait_ms > 0).then(|| Duration::from_millis(wait_ms)));
                prop_assert_eq!(settings.connections.max_connections, max_connections);
            }
            Err(error) => {
                prop_assert!(!runnable, "refused a runnable setting: {error}");
                prop_assert!(names_flag_and_variable(&error), "{error}");
            }
        }
    }

    #[test]
    fn any_argument_list_parses_or_errors_without_panicking(
        args in prop::collection::vec("--?[a-z-]{0,24}(=[ -~]{0,12})?", 0..6),
    ) {
        let mut argv = vec!["idemgate".to_owned(), "serve".to_owned()];
        argv.extend(args);
        if let Ok(cli) = Cli::try_parse_from(argv) {
            if let Command::Serve(args) = cli.command {
                let _ = ServeSettings::from_args(&args);
            }
        }
    }
}
