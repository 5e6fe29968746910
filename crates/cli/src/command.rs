//! The binary's whole command line: the server's commands ([`clarion::cli::Command`]) flattened
//! beside the load generator's (`bench`, and the hidden `bench-worker` it starts).

use clap::{Parser, Subcommand};

use clarion::cli::Command as Server;

/// Clarion's whole command line: the server's commands and the load generator.
#[derive(Debug, Parser)]
#[command(name = "clarion", version, about = clarion::cli::ABOUT, after_help = clarion::cli::AFTER_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// Parsed once at startup; boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Server(Server),
    /// Load-test a running server: many connections, every delivery checked (docs/benchmarks.md).
    Bench(clarion_bench::BenchArgs),
    /// One load-generating process of `clarion bench` (started by it; reads its job on stdin).
    #[command(hide = true)]
    BenchWorker,
}
