//! `palisade crds`: the CustomResourceDefinitions, generated from the types in
//! [`crate::api`] (`make crds` writes them to `crds/` and the chart).

use std::process::ExitCode;

pub fn run() -> ExitCode {
    print!("{}", crate::api::crds_yaml());
    ExitCode::SUCCESS
}
