//! One module per subcommand. Each takes its arguments from [`crate::cli`], checks
//! them into its settings, and runs on the shared services; none imports another
//! (what the operator commands share is in `operator`).

pub mod audit;
pub mod completions;
pub mod keys;
pub mod man;
mod operator;
pub mod proxy;
pub mod serve;
