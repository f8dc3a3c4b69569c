//! The external tools the chart and node tests run (the pinned helm and kubectl that
//! `make test` puts first on PATH), and how their output is shown when they fail.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The path of `name` on PATH, or a panic that says how to get it there.
pub fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH. The chart tests run the pinned helm and kubectl: use \
                 `make test`, or put the control-plane binaries first on PATH, e.g. \
                 PATH=~/.cache/palisade/bin-k8s-<version>-etcd-<version>-helm-<version>:$PATH \
                 (the directory `make controlplane-bins` fills)"
            )
        })
}

/// Runs `cmd` to completion with `stdin` (or none), capturing its output.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Output {
    let shown = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("running {shown}: {e}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// A finished process's exit status and output, for a failure message.
pub fn text(out: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a test suite of another language (`go test`, pytest) to completion, panics with
/// its output when it fails, and returns its output (stdout, then stderr).
pub fn run_suite(what: &str, mut command: Command) -> String {
    let started = std::time::Instant::now();
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run it: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{what} failed ({:?}):\n{text}",
        output.status
    );
    eprintln!("{what}: passed in {:.1} s", started.elapsed().as_secs_f64());
    text
}

/// kubectl against the test cluster.
pub fn kubectl_command() -> Command {
    let mut cmd = Command::new(tool("kubectl"));
    cmd.env("KUBECONFIG", super::kubeconfig_path());
    cmd
}

/// kubectl against the test cluster, with `stdin`.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = kubectl_command();
    cmd.args(args);
    run(cmd, stdin)
}

/// kubectl `args` against the test cluster, which must succeed.
pub fn kubectl_ok(args: &[&str]) -> Output {
    let out = kubectl(args, None);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{}",
        text(&out)
    );
    out
}
