//! The test databases (`make databases`): started once per test binary or reused;
//! a test fails with the reason when they cannot be started, never skips.

use std::process::Command;
use std::sync::OnceLock;

fn ensure_started() {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = STARTED.get_or_init(|| {
        let out = Command::new("make")
            .args(["-s", "--no-print-directory", "databases"])
            .current_dir(crate::repo_root())
            .output()
            .map_err(|e| format!("running make databases: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "make databases failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The PostgreSQL URL (`make test` exports it; the Makefile's default otherwise).
pub fn postgres_url() -> String {
    ensure_started();
    std::env::var("PALISADE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:15432/postgres".into())
}

pub fn redis_url() -> String {
    ensure_started();
    std::env::var("PALISADE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:16379/".into())
}

/// The MariaDB URL, from `PALISADE_TEST_MYSQL` (`make test` exports it, e.g.
/// `mysql://root@127.0.0.1:13306/`); a run without it fails naming it.
pub fn mysql_url() -> String {
    ensure_started();
    std::env::var("PALISADE_TEST_MYSQL").unwrap_or_else(|_| {
        panic!(
            "PALISADE_TEST_MYSQL is not set: the MariaDB tests need the URL of the server \
             `make databases` starts, e.g. PALISADE_TEST_MYSQL=mysql://root@127.0.0.1:13306/"
        )
    })
}

/// `databases.sh restart postgres|redis|mysql` on the rig's state directory (what
/// `make databases` started), for the crash tests.
pub fn restart(which: &str) {
    ensure_started();
    let root = crate::repo_root();
    let port = |url: String| {
        url.rsplit(':')
            .next()
            .unwrap_or_default()
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let out = Command::new(root.join("tests/databases/databases.sh"))
        .args(["restart", which])
        .env("STATE_DIR", root.join("target/databases"))
        .env("PG_PORT", port(postgres_url()))
        .env("REDIS_PORT", port(redis_url()))
        .env(
            "MYSQL_PORT",
            port(std::env::var("PALISADE_TEST_MYSQL").unwrap_or_else(|_| ":13306".into())),
        )
        .output()
        .expect("running databases.sh");
    assert!(
        out.status.success(),
        "databases.sh restart {which}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The runtime of a database test: two worker threads, so concurrent writers really
/// run at the same time.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
