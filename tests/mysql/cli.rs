//! `palisade fence --store mysql://...`: the exit codes of the other stores.

use support::cli;
use support::databases;

use crate::{APP_USER, SERVER, SHOW_USER, TEST_DB, setup, url_as};

/// As the least-privilege writer: 0 admitted, 3 stale, 2 bad arguments, 1 a store
/// error; `--show` needs SELECT on the marks.
#[test]
fn cli_admits_refuses_with_exit_3_and_shows() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let _ = support::databases::runtime().block_on(setup());
    let url = url_as(APP_USER, TEST_DB);
    let key = databases::unique("cli");
    let run = |args: &[&str]| cli::fence(&url, args);
    let ok = run(&["--key", &key, "--token", "34"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("admitted: fencing token 34"));
    let equal = run(&["--key", &key, "--token", "34", "--lock-timeout", "300ms"]);
    assert!(
        equal.status.success(),
        "{}",
        String::from_utf8_lossy(&equal.stderr)
    );
    let stale = run(&["--key", &key, "--token", "33"]);
    assert_eq!(stale.status.code(), Some(3));
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(
        err.contains("33") && err.contains("34") && err.contains(&key),
        "{err}"
    );
    // The token from the environment, as `palisade lock` passes it.
    let from_env = cli::palisade()
        .args(["fence", "--store", &url, "--key", &key])
        .env("PALISADE_FENCING_TOKEN", "35")
        .output()
        .unwrap();
    assert!(
        from_env.status.success(),
        "{}",
        String::from_utf8_lossy(&from_env.stderr)
    );
    assert_eq!(run(&["--key", "", "--token", "1"]).status.code(), Some(2));
    assert_eq!(
        run(&["--key", &key, "--token", "-1"]).status.code(),
        Some(2)
    );
    assert_eq!(
        run(&["--key", &key, "--token", "40", "--payload", "x"])
            .status
            .code(),
        Some(2)
    );
    // The writer may not read the marks, nor install; the account granted SELECT may read.
    let denied = run(&["--show"]);
    assert_eq!(denied.status.code(), Some(1));
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(err.contains("denied"), "{err}");
    let install = run(&["--create"]);
    assert_eq!(install.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&install.stderr).contains("cannot install"));
    let show = cli::fence(url_as(SHOW_USER, "palisade"), &["--show"]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(String::from_utf8_lossy(&show.stdout).contains(&format!("\"{key}\": 35")));
    // A server that does not answer is a store error.
    let gone = cli::fence(
        "mysql://root@127.0.0.1:1/",
        &["--key", &key, "--token", "36"],
    );
    assert_eq!(gone.status.code(), Some(1));
}
