//! One module per subcommand. Each takes its arguments from [`crate::cli`], checks
//! them into its settings, and runs on the shared services; none imports another.

pub mod audit;
pub mod completions;
pub mod keys;
pub mod man;
pub mod proxy;
pub mod serve;
