//! The command line: `palisade <subcommand>`, also installable as the kubectl plugin `kubectl-palisade`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "palisade", version, about = "Kubernetes leases with fencing tokens")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions (Lease, LeaseClaim) as YAML.
    Crds,
    /// Admit a write to a file-backed fenced store (the enforcement side of a fencing token).
    Fence(crate::fence::FenceArgs),
}

pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crds => {
            print!("{}", crate::api::crds_yaml());
            ExitCode::SUCCESS
        }
        Command::Fence(args) => crate::fence::run(args),
    }
}
