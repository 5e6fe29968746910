//! The `clarion` binary: parses the command line and hands over to the library.

use clap::Parser as _;
use clarion::cli::{Cli, Command};
use clarion::group::Role;

fn main() -> std::process::ExitCode {
    clarion::log::init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Serve(args) => args
            .resolve()
            .map_err(anyhow::Error::from)
            .and_then(|config| match Role::of(&config)? {
                Role::Single => clarion::server::run(config),
                Role::Supervisor => clarion::group::supervise(config),
                Role::Member(member) => clarion::server::run_member(config, member),
            }),
        Command::Publish(args) => clarion::publish::run(args),
        Command::Cert(args) => args.run(),
        Command::Bench(args) => clarion_bench::run::main(args.clone()),
        Command::BenchWorker => clarion_bench::worker::main(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("clarion: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
