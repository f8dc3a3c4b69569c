//! The seed's story as an automated test: a holder's write delayed in the network
//! while the holder is paused with SIGSTOP past its lease arrives with the old token
//! and is rejected as stale (runs tests/demo/demo.sh, the script behind `make demo`,
//! against the real API server).

use std::process::Command;

#[test]
fn a_paused_holder_resumes_and_its_stale_write_is_rejected() {
    let kubeconfig = support::kubeconfig_path();
    let root = support::repo_root();
    let work = root.join("target/demo-test");
    let out = Command::new("bash")
        .arg(root.join("tests/demo/demo.sh"))
        .current_dir(root)
        .env("KUBECONFIG", kubeconfig)
        .env("PALISADE", env!("CARGO_BIN_EXE_palisade"))
        .env("KUBECTL", "kubectl")
        .env("DEMO_NAMESPACE", "palisade-demo-test")
        .env("DEMO_DIR", &work)
        .output()
        .expect("running tests/demo/demo.sh (kubectl must be on PATH: run through make test)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("verdict: SAFE"), "{stdout}");

    // Check the store itself, not only the script's words.
    let journal = std::fs::read_to_string(work.join("store/journal.jsonl")).unwrap();
    let accepted: Vec<serde_json::Value> = journal
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let payloads: Vec<&str> = accepted
        .iter()
        .map(|e| e["payload"].as_str().unwrap())
        .collect();
    assert_eq!(
        payloads[..2],
        ["worker-a first write", "worker-b first write"],
        "the stale second write of worker-a must not be accepted"
    );
    assert!(!payloads.contains(&"worker-a second write"), "{payloads:?}");
    let (token_a, token_b) = (
        accepted[0]["token"].as_i64().unwrap(),
        accepted[1]["token"].as_i64().unwrap(),
    );
    assert!(token_b > token_a);
    let marks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("store/marks.json")).unwrap())
            .unwrap();
    assert_eq!(
        marks["highest"]["ledger"].as_i64(),
        Some(token_b),
        "the store's highest token is the new holder's"
    );
    let delivered = std::fs::read_to_string(work.join("network.log")).unwrap();
    assert!(
        delivered.contains(&format!("stale fencing token {token_a}")),
        "{delivered}"
    );
}
