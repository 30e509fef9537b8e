#![doc = include_str!("../README.md")]

mod config;
pub mod context;
mod execution;
pub mod finality;
mod handler;
mod layer;
pub mod principal;
pub mod problem;
mod response;
mod service;
mod tasks;
pub mod telemetry;

pub use idemgate_core::*;

pub use config::PathSource;
pub use context::OperationContext;
pub use finality::{Finality, ServerErrorPolicy};
pub use layer::IdempotencyLayer;
pub use principal::{DefaultPrincipal, Principal, PrincipalError, PrincipalExtractor};
pub use problem::ProblemDetails;
pub use response::{IDEMPOTENCY_RESPONSE, IDEMPOTENT_REPLAYED};
pub use service::Idempotency;
pub use tasks::DetachedTasks;
