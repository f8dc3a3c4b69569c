//! `palisade fence --store postgres://...`.

use palisade::fence::postgres;

use support::cli;
use support::databases::{self, runtime};

use crate::{APP_ROLE, SERVER, SHOW_ROLE, TEST_DB, mark, setup, url_as};

/// `palisade fence --store postgres://...` as the least-privilege role: the exit
/// codes of the file store; `--show` needs SELECT on the marks.
#[test]
fn cli_admits_refuses_with_exit_3_and_shows() {
    let _server = SERVER.read().unwrap();
    runtime().block_on(setup());
    let url = url_as(APP_ROLE, TEST_DB);
    let key = databases::unique("cli");
    let run = |args: &[&str]| cli::fence(&url, args);
    let ok = run(&["--key", &key, "--token", "34"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("admitted: fencing token 34"));
    let stale = run(&["--key", &key, "--token", "33"]);
    assert_eq!(stale.status.code(), Some(3));
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(
        err.contains("33") && err.contains("34") && err.contains(&key),
        "{err}"
    );
    assert_eq!(run(&["--key", "", "--token", "1"]).status.code(), Some(2));
    assert_eq!(
        run(&["--key", &key, "--token", "40", "--payload", "x"])
            .status
            .code(),
        Some(2)
    );
    // The application role may not read the marks; the role granted SELECT may.
    let denied = run(&["--show"]);
    assert_eq!(denied.status.code(), Some(1));
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(err.contains("permission denied"), "{err}");
    let show = cli::fence(url_as(SHOW_ROLE, TEST_DB), &["--show"]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(String::from_utf8_lossy(&show.stdout).contains(&format!("\"{key}\": 34")));
}

/// Under `palisade lock` the CLI's default key is `<namespace>/<lease>`; a mark left
/// under the bare lease name by an older palisade is never started over.
#[test]
fn cli_default_key_is_namespace_slash_lease_and_never_starts_a_mark_over() {
    let _server = SERVER.read().unwrap();
    let rt = runtime();
    let admin = rt.block_on(setup());
    let ns = "payments";
    let lease = databases::unique("migrate");
    let namespaced = format!("{ns}/{lease}");
    // An older palisade fenced under the bare lease name.
    rt.block_on(postgres::admit_with(&admin, &lease, 40))
        .unwrap();
    let run = |lease: &str, token: &str, extra: &[&str]| {
        cli::palisade()
            .arg("fence")
            .arg("--store")
            .arg(url_as(APP_ROLE, TEST_DB))
            .args(extra)
            .env("PALISADE_NAMESPACE", ns)
            .env("PALISADE_LEASE", lease)
            .env("PALISADE_FENCING_TOKEN", token)
            .output()
            .unwrap()
    };
    let out = run(&lease, "41", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{namespaced:?}")) && err.contains(&format!("{lease:?}")),
        "{err}"
    );
    assert!(err.contains("--key"), "{err}");
    assert_eq!(rt.block_on(mark(&admin, &namespaced)), None);
    assert_eq!(rt.block_on(mark(&admin, &lease)), Some(40));

    // Naming the key goes on with the old mark.
    let out = run(&lease, "41", &["--key", &lease]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rt.block_on(mark(&admin, &lease)), Some(41));

    // Once the mark is migrated to the namespaced key, the default works.
    rt.block_on(postgres::admit_with(&admin, &namespaced, 41))
        .unwrap();
    let out = run(&lease, "42", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("for key {namespaced:?}")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(rt.block_on(mark(&admin, &namespaced)), Some(42));

    // A lease new to the database starts under the namespaced key.
    let fresh = databases::unique("fresh");
    let out = run(&fresh, "3", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rt.block_on(mark(&admin, &format!("{ns}/{fresh}"))), Some(3));
    assert_eq!(rt.block_on(mark(&admin, &fresh)), None);
}
