//! The `clarion` binary: parses the command line and hands over to the server library
//! (`serve`, `publish`, `cert`, `token`) or to the load generator (`bench`). It is the only crate that
//! links both, so the server library never depends on the bench.

mod command;

use clarion::cli::Command as Server;
use clarion::group::Role;
use command::{Cli, Command};

fn main() -> std::process::ExitCode {
    clarion::log::init();
    let cli: Cli = clarion::cli::parse();
    if matches!(
        cli.command,
        Command::Server(Server::Serve(_) | Server::Publish(_))
    ) {
        let names = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned());
        for warning in clarion::config::env::unknown_variables(names) {
            clarion::log::warn(format_args!("{warning}"));
        }
    }
    let result = match &cli.command {
        Command::Server(Server::Serve(args)) => args
            .resolve()
            .map_err(anyhow::Error::from)
            .and_then(|config| {
                let lone = clarion::server::Lone {
                    upgrade_from: args.upgrade_from(),
                    pid_file: args.pid_file(),
                };
                match Role::of(&config)? {
                    Role::Single => clarion::server::run_lone(config, &lone),
                    _ if lone.upgrade_from.is_some() || lone.pid_file.is_some() => {
                        Err(anyhow::anyhow!(
                            "--upgrade-from and --pid-file are for a single process; a \
                             --processes group is upgraded with SIGUSR1 to its supervisor"
                        ))
                    }
                    Role::Supervisor => clarion::group::supervise(config),
                    Role::Member(member) => clarion::server::run_member(config, member),
                }
            }),
        Command::Server(Server::Publish(args)) => clarion::publish::run(args),
        Command::Server(Server::Cert(args)) => args.run(),
        Command::Server(Server::Token(args)) => clarion::token::run(args),
        Command::Bench(args) => clarion_bench::run::main(args.clone()),
        Command::BenchWorker => clarion_bench::worker::main(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("clarion: {}", clarion::redact::urls(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}
