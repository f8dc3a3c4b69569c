//! The probe (`palisade fence check`) passes on SeaweedFS and reports moto's server
//! mode, which checks If-Match and If-None-Match apart from the write they guard: with
//! bodies large enough that moto spools them to disk between its check and its write,
//! racing conditional writers both win.

use std::time::Duration;

use palisade::fence::s3::probe::{self, ProbeOptions, Verdict};

use crate::{BUCKET, atomic_server, broken_server, fence_in, runtime};

#[test]
fn the_probe_passes_on_seaweedfs() {
    runtime().block_on(async {
        let fence = fence_in(&atomic_server(), BUCKET).await;
        // SeaweedFS is atomic whatever the size: small bodies keep the test short.
        let options = ProbeOptions {
            rounds: 4,
            writers: 8,
            body_bytes: 256 << 10,
            time_limit: Duration::from_secs(60),
        };
        let report = probe::probe(fence.client(), "tests/probe", &options)
            .await
            .unwrap();
        assert!(report.passed(), "{report}");
        for name in ["conditions", "racing creates", "racing updates"] {
            let check = report
                .check(name)
                .unwrap_or_else(|| panic!("no {name}: {report}"));
            assert_eq!(check.verdict, Verdict::Pass, "{report}");
        }
        let repeats = report.check("etag repeats").expect("the ETag check");
        assert_eq!(repeats.verdict, Verdict::Info);
    });
}

#[test]
fn the_probe_reports_that_moto_lets_racing_conditional_writers_through() {
    runtime().block_on(async {
        let fence = fence_in(&broken_server(), BUCKET).await;
        let report = probe::probe(fence.client(), "tests/probe", &ProbeOptions::default())
            .await
            .unwrap();
        assert!(!report.passed(), "moto passed:\n{report}");
        // moto does check the conditions, one request at a time: what fails is the race.
        assert_eq!(
            report.check("conditions").unwrap().verdict,
            Verdict::Pass,
            "{report}"
        );
        let raced = ["racing creates", "racing updates"]
            .iter()
            .any(|name| report.check(name).unwrap().verdict == Verdict::Fail);
        assert!(raced, "{report}");
        assert!(report.to_string().contains("does NOT honour"), "{report}");
    });
}
