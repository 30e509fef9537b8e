#![doc = include_str!("../README.md")]

pub mod conditional;
mod config;
pub mod context;
mod durations;
mod execution;
pub mod finality;
pub mod grpc;
mod handler;
pub mod journal;
mod jsonrpc;
mod layer;
pub mod principal;
pub mod problem;
mod recording;
mod replaying;
mod response;
mod service;
mod tasks;
pub mod telemetry;
mod waiting;
pub mod webhook;

// The protocol from `idemgate-core`, so an application depends on this crate
// alone. Listed one by one: a core item is part of this crate's API only once it
// is named here (CONTRIBUTING.md, "Public API").
#[doc(inline)]
pub use idemgate_core::{
    BoxError, Claim, ClaimRequest, Completion, Decision, EvictMode, Eviction, FencedWrite,
    FinalStatus, Lease, LeaseOrigin, MemoryStore, Snapshot, Store, StoreError,
};
#[doc(inline)]
pub use idemgate_core::{
    audit, cache, compression, deadline, decide, encoding, estimate, fingerprint, key, memory,
    path, record, resource_lease, scope, signals, store, time, transaction,
};

pub use config::{ObservedResponses, PathSource, StrategyMode};
pub use context::OperationContext;
pub use execution::is_streamed_media_type;
pub use finality::{Finality, ServerErrorPolicy};
pub use grpc::GrpcCode;
pub use layer::{
    DEFAULT_BODY_LIMIT, DEFAULT_LEASE, DEFAULT_RESPONSE_LIMIT, DEFAULT_TTL, DEFAULT_WAIT,
    IdempotencyLayer,
};
pub use principal::{DefaultPrincipal, Principal, PrincipalError, PrincipalExtractor};
pub use problem::ProblemDetails;
pub use response::{
    IDEMPOTENCY_DEDUP, IDEMPOTENCY_RESPONSE, IDEMPOTENT_REPLAYED, ReplayedHeaders, UnlistableHeader,
};
pub use service::Idempotency;
pub use tasks::DetachedTasks;
