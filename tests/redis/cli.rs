//! `palisade fence --store redis://...` (and `rediss://`).

use std::process::Command;

use palisade::fence::redis as fence_redis;

use support::cli;
use support::databases::{self, runtime};

use crate::{DEFAULT_PERSISTENCE, OwnRedis, SAFE, SERVER, connect, get};

/// `palisade fence --store redis://...`: the payload is the protected write.
#[test]
fn cli_admits_writes_the_payload_and_refuses_with_exit_3() {
    let _server = SERVER.read().unwrap();
    let url = databases::redis_url();
    let key = databases::unique("redis-cli");
    let run = |args: &[&str]| cli::fence(&url, args);
    assert!(run(&["--key", &key, "--create"]).status.success());
    let ok = run(&["--key", &key, "--token", "34", "--payload", "new"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stale = run(&["--key", &key, "--token", "33", "--payload", "stale"]);
    assert_eq!(stale.status.code(), Some(3));
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(err.contains("33") && err.contains("34"), "{err}");
    runtime().block_on(async {
        let mut conn = connect().await;
        let value = get(&mut conn, &fence_redis::data_key(&key, "value")).await;
        assert_eq!(value.as_deref(), Some("new"));
    });
    assert_eq!(run(&["--key", "", "--token", "1"]).status.code(), Some(2));
}

/// `palisade fence --create` makes the mark (no token); an admit without it fails
/// with exit 1 naming the key; a Redis it sees is unsafe is refused, exit 1.
#[test]
fn cli_create_then_admit_and_refusals() {
    let _server = SERVER.read().unwrap();
    let url = databases::redis_url();
    let key = databases::unique("redis-cli-create");
    let run = |args: &[&str]| cli::fence(&url, args);
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let uncreated = run(&["--key", &key, "--token", "3"]);
    assert_eq!(uncreated.status.code(), Some(1), "{}", stderr(&uncreated));
    let message = stderr(&uncreated);
    assert!(
        message.contains(&format!("{key:?}")) && message.contains("missing"),
        "{message}"
    );

    let with_token = run(&["--key", &key, "--create", "--token", "3"]);
    assert_eq!(with_token.status.code(), Some(2), "{}", stderr(&with_token));

    let created = run(&["--key", &key, "--create"]);
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(String::from_utf8_lossy(&created.stdout).contains("created"));
    let again = run(&["--key", &key, "--create"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("kept as it is"));

    let admitted = run(&["--key", &key, "--token", "3"]);
    assert!(admitted.status.success(), "{}", stderr(&admitted));
    assert!(
        String::from_utf8_lossy(&admitted.stdout).contains("first token"),
        "{}",
        String::from_utf8_lossy(&admitted.stdout)
    );

    let default = OwnRedis::start(DEFAULT_PERSISTENCE);
    for args in [
        &["--key", "ledger", "--create"][..],
        &["--key", "ledger", "--token", "3"][..],
    ] {
        let out = cli::fence(default.url(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("appendonly is \"no\" (needs yes)"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// `rediss://`: the CLI speaks TLS (rustls; the server's certificate checked
/// against the roots, here `SSL_CERT_FILE`, a CA the test makes with openssl).
#[test]
fn cli_speaks_tls_to_rediss() {
    let certs = tempfile::tempdir().unwrap();
    let path = |name: &str| certs.path().join(name);
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(certs.path())
            .output()
            .expect("running openssl to make the test's certificates");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(path("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (port_s, cert, key, ca) = (
        port.to_string(),
        path("server.pem").display().to_string(),
        path("server.key").display().to_string(),
        path("ca.pem").display().to_string(),
    );
    let mut settings = SAFE.to_vec();
    settings.extend([
        "--port",
        "0",
        "--tls-port",
        &port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    // Its plain port is turned off (`--port 0`); the TLS port is ours.
    let _server = OwnRedis::start(&settings);
    let url = format!("rediss://127.0.0.1:{port}/");
    let fence = |args: &[&str]| {
        cli::palisade()
            .env("SSL_CERT_FILE", &ca)
            .args(["fence", "--store", &url])
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["--key", "ledger", "--create"][..],
        &["--key", "ledger", "--token", "4", "--payload", "over tls"][..],
    ] {
        let out = fence(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        fence(&["--key", "ledger", "--token", "3"]).status.code(),
        Some(3)
    );
}
