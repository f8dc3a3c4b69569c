//! `palisade crds`: the CustomResourceDefinitions, generated from the types in
//! [`crate::crd`] (`make crds` writes them to `crds/` and the chart).

use std::process::ExitCode;

pub fn run() -> ExitCode {
    print!("{}", crate::crd::crds_yaml());
    ExitCode::SUCCESS
}
