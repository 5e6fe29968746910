//! The `clarion` binary: parses the command line and hands over to the library.

use clarion::cli::Command;
use clarion::group::Role;

fn main() -> std::process::ExitCode {
    clarion::log::init();
    let cli = clarion::cli::parse();
    if matches!(cli.command, Command::Serve(_) | Command::Publish(_)) {
        let names = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned());
        for warning in clarion::config::env::unknown_variables(names) {
            clarion::log::warn(format_args!("{warning}"));
        }
    }
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
