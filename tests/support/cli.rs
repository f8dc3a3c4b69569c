//! The `palisade` binary as a process. Needs nothing else of `support`.

use std::path::PathBuf;

/// The `palisade` binary cargo built for the test run. Cargo sets
/// `CARGO_BIN_EXE_palisade` at build time only for the palisade package's own test
/// targets, not for this library: it is read from the environment, where `cargo test`
/// sets it too, or else found where cargo puts it, next to the test binary's `deps/`.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_palisade") {
        return path.into();
    }
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let dir = test_binary.parent().expect("the test binary's directory");
    let profile_dir = if dir.ends_with("deps") {
        dir.parent().expect("the profile directory above deps/")
    } else {
        dir
    };
    profile_dir.join(format!("palisade{}", std::env::consts::EXE_SUFFIX))
}

/// The real binary, with none of the variables `palisade lock` would set, nor a pod
/// identity, leaking in from the environment of whoever runs the tests.
pub fn palisade() -> std::process::Command {
    let mut command = std::process::Command::new(binary());
    for var in [
        "PALISADE_FENCING_TOKEN",
        "PALISADE_SLOT",
        "PALISADE_FENCE_KEY",
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

/// A finished process's exit status and output, for an assertion's message.
pub fn describe(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
