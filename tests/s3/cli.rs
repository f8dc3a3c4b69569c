//! `palisade fence --store s3://BUCKET ...` and `palisade fence check s3://...`: exit
//! codes 0 written (or passed), 1 store error (or a failed check), 2 bad arguments,
//! 3 stale.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use support::cli;

use crate::{
    BUCKET, atomic_server, broken_server, credentials, fence, fence_in, runtime, unique_key,
};

/// `palisade ARGS...` with the AWS environment of `endpoint`.
fn palisade(endpoint: &str, args: &[&str]) -> Command {
    let (key, secret) = credentials();
    let mut command = cli::palisade();
    command
        .args(args)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env_remove("AWS_SESSION_TOKEN");
    command
}

fn run(endpoint: &str, args: &[&str]) -> Output {
    palisade(endpoint, args).output().expect("run palisade")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn cli_writes_refuses_stale_with_exit_3_and_shows_the_token() {
    let rt = runtime();
    let fence = rt.block_on(fence());
    let endpoint = atomic_server();
    let key = unique_key("cli");
    let store = format!("s3://{BUCKET}");
    let write = |token: &str, body: &[u8]| {
        let mut child = palisade(&endpoint, &["fence", "--store", &store, "--key", &key])
            .args(["--token", token, "--body-file", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(body).unwrap();
        child.wait_with_output().unwrap()
    };
    let ok = write("12", b"line 1\n");
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("written: fencing token 12"));
    let stale = write("11", b"stale\n");
    assert_eq!(stale.status.code(), Some(3), "{}", stderr(&stale));
    assert!(stderr(&stale).contains("stale fencing token 11") && stderr(&stale).contains("12"));
    let stored = rt.block_on(fence.get(&key)).unwrap().unwrap();
    assert_eq!(
        (stored.token, stored.payload.as_slice()),
        (12, &b"line 1\n"[..])
    );
    let show = run(
        &endpoint,
        &["fence", "--store", &store, "--key", &key, "--show"],
    );
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(String::from_utf8_lossy(&show.stdout).contains(&format!("\"{key}\": 12")));
}

#[test]
fn cli_bad_input_exits_2_and_store_errors_exit_1() {
    let _ = runtime().block_on(fence());
    let endpoint = atomic_server();
    let store = format!("s3://{BUCKET}");
    let fence_args = |extra: &[&str]| {
        let mut args = vec!["fence", "--store", &store, "--key", "tests/cli-bad"];
        args.extend_from_slice(extra);
        run(&endpoint, &args)
    };
    let over = fence_args(&["--token", "9223372036854775808", "--payload", "x"]);
    assert_eq!(over.status.code(), Some(2), "{}", stderr(&over));
    assert!(stderr(&over).contains("signed 64-bit"), "{}", stderr(&over));
    let no_body = fence_args(&["--token", "1"]);
    assert_eq!(no_body.status.code(), Some(2), "{}", stderr(&no_body));
    assert!(
        stderr(&no_body).contains("--body-file"),
        "{}",
        stderr(&no_body)
    );
    let create = fence_args(&["--create"]);
    assert_eq!(create.status.code(), Some(2), "{}", stderr(&create));
    let no_bucket = ["--key", "k", "--token", "1", "--payload", "x"];
    let missing = palisade(
        &endpoint,
        &["fence", "--store", "s3://palisade-no-such-bucket"],
    )
    .args(no_bucket)
    .output()
    .unwrap();
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("palisade-no-such-bucket"),
        "{}",
        stderr(&missing)
    );
    let no_credentials = palisade(&endpoint, &["fence", "--store", &store, "--key", "k"])
        .args(["--token", "1", "--payload", "x"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .unwrap();
    assert_eq!(
        no_credentials.status.code(),
        Some(1),
        "{}",
        stderr(&no_credentials)
    );
    assert!(stderr(&no_credentials).contains("AWS_ACCESS_KEY_ID is not set"));
    let wrong_scheme = run(&endpoint, &["fence", "check", "gs://bucket/prefix"]);
    assert_eq!(
        wrong_scheme.status.code(),
        Some(2),
        "{}",
        stderr(&wrong_scheme)
    );
}

#[test]
fn cli_check_exits_0_on_seaweedfs_and_1_on_moto() {
    let rt = runtime();
    rt.block_on(fence_in(&broken_server(), BUCKET));
    let _ = rt.block_on(fence());
    let url = format!("s3://{BUCKET}/tests/cli-check");
    let small = ["--rounds", "3", "--body-kib", "256"];
    let atomic = palisade(&atomic_server(), &["fence", "check", &url])
        .args(small)
        .output()
        .unwrap();
    assert!(
        atomic.status.success(),
        "{}{}",
        String::from_utf8_lossy(&atomic.stdout),
        stderr(&atomic)
    );
    assert!(String::from_utf8_lossy(&atomic.stdout).contains("PASS racing updates"));
    let broken = run(&broken_server(), &["fence", "check", &url]);
    let out = String::from_utf8_lossy(&broken.stdout);
    assert_eq!(broken.status.code(), Some(1), "{out}{}", stderr(&broken));
    assert!(out.contains("FAIL racing"), "{out}");
}
