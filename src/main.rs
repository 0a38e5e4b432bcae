use clap::Parser;

use memcached_operator::config::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crd) => {
            print!("{}", memcached_operator::api::crd_yaml());
            std::process::ExitCode::SUCCESS
        }
        Some(Command::Agent(command)) => memcached_operator::agent::main(command),
        None => memcached_operator::manager::main(cli.run),
    }
}
