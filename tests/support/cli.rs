//! The `palisade` binary as a process. Needs nothing else of `support`: the database
//! tests include it by path.

/// The real binary, with none of the variables `palisade lock` would set, nor a pod
/// identity, leaking in from the environment of whoever runs the tests.
pub fn palisade() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    for var in [
        "PALISADE_FENCING_TOKEN",
        "PALISADE_LEASE",
        "PALISADE_NAMESPACE",
        "PALISADE_CLAIM",
        "PALISADE_HOLDER",
        "POD_NAME",
        "POD_UID",
        "POD_NAMESPACE",
    ] {
        command.env_remove(var);
    }
    command
}

/// `palisade fence --store STORE ARGS...`, run to completion.
pub fn fence(store: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> std::process::Output {
    palisade()
        .arg("fence")
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("run palisade fence")
}
