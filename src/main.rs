//! The `palisade` binary: argument parsing only; everything else lives in the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    palisade::cli::main(palisade::cli::Cli::parse())
}
