//! Fencing at the protected resource (DESIGN rule 6). Placeholder: being written.

use std::process::ExitCode;

/// `palisade fence ...`: admit a token against a file-backed fence from the shell.
#[derive(clap::Args, Debug)]
pub struct FenceArgs {}

pub fn run(_args: FenceArgs) -> ExitCode {
    ExitCode::FAILURE
}
