//! Bad input, everywhere palisade parses what a user wrote: fencing tokens from
//! annotations and the environment, durations, resourceVersions, and the CRD objects
//! the controller reads. Property tests: the parsers never panic, accept exactly the
//! documented spellings, and agree with the admission policy. No cluster needed
//! (tests/bad_input.rs has the manifests the real API server must reject).

use std::time::Duration;

use palisade::cli::{parse_duration, parse_lease_duration};
use palisade::crd::{Lease, LeaseClaim};
use palisade::fence::{ParseTokenError, parse_token};
use palisade::token::parse_resource_version;
use proptest::prelude::*;
use serde_json::{Value, json};

/// The admission policy's test for a well-formed token annotation
/// (charts/palisade/templates/policy-object-fencing.yaml): `^[0-9]+$`, at most 18.
fn policy_well_formed(s: &str) -> bool {
    !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,16}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Field names the CRDs use, mixed with others, so generated objects hit real fields.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("leaseDurationSeconds".to_string()),
        Just("leaseName".to_string()),
        Just("holderIdentity".to_string()),
        Just("pod".to_string()),
        Just("renewTime".to_string()),
        Just("holder".to_string()),
        Just("fencingToken".to_string()),
        Just("phase".to_string()),
        Just("waiting".to_string()),
        "[a-zA-Z]{1,12}",
    ]
}

fn object_like(kind: &'static str) -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map(field_name(), any_json(), 0..5),
        prop::collection::btree_map(field_name(), any_json(), 0..5),
    )
        .prop_map(move |(spec, status)| {
            json!({
                "apiVersion": "palisade.dev/v1alpha1",
                "kind": kind,
                "metadata": {"name": "x", "namespace": "y", "resourceVersion": "7"},
                "spec": spec,
                "status": status,
            })
        })
}

proptest! {
    #[test]
    fn token_parser_accepts_exactly_unsigned_decimals(s in ".{0,24}") {
        match parse_token(&s) {
            Ok(n) => {
                prop_assert!(s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty(), "{s:?}");
                prop_assert_eq!(s.parse::<u64>().ok(), Some(n));
            }
            Err(ParseTokenError::Empty) => prop_assert!(s.is_empty()),
            Err(e @ (ParseTokenError::Negative(_) | ParseTokenError::NotDecimal(_) | ParseTokenError::Overflow(_))) => {
                prop_assert!(s.parse::<u64>().is_err() || s.starts_with('+'), "{s:?} refused: {e}");
                // The message quotes the input, so the user sees what was wrong.
                prop_assert!(e.to_string().contains(&format!("{s:?}")), "{e}");
            }
        }
    }

    #[test]
    fn token_parser_round_trips_every_token(n in any::<u64>()) {
        prop_assert_eq!(parse_token(&n.to_string()), Ok(n));
    }

    /// Whatever the API server's policy accepts as a token, the library reads as the
    /// same number (CEL's int() of 1 to 18 digits is their decimal value).
    #[test]
    fn token_parser_agrees_with_the_admission_policy(s in "[0-9]{1,18}|[0-9 +\\-.]{1,20}") {
        if policy_well_formed(&s) {
            prop_assert_eq!(parse_token(&s), Ok(s.parse::<u64>().unwrap()));
        }
    }

    #[test]
    fn durations_parse_exactly_number_and_unit(
        n in 0u64..1_000_000,
        unit in prop::sample::select(vec![("ms", 1u64), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)]),
    ) {
        let text = format!("{n}{}", unit.0);
        prop_assert_eq!(parse_duration(&text), Ok(Duration::from_millis(n * unit.1)));
    }

    #[test]
    fn durations_never_panic_and_name_the_input(s in ".{0,16}") {
        if let Err(e) = parse_duration(&s) {
            prop_assert!(e.to_string().starts_with(&format!("invalid duration {s:?}")), "{e}");
        } else {
            prop_assert!(s.starts_with(|c: char| c.is_ascii_digit()), "{s:?} accepted");
        }
    }

    #[test]
    fn lease_durations_are_whole_seconds_from_1s_to_24h(ms in 0u64..100_000_000) {
        let ok = ms % 1000 == 0 && (1_000..=86_400_000).contains(&ms);
        let result = parse_lease_duration(&format!("{ms}ms"));
        prop_assert_eq!(result.is_ok(), ok, "{}ms: {:?}", ms, result);
    }

    #[test]
    fn resource_versions_are_canonical_decimals(s in "[0-9]{0,20}|.{0,8}") {
        match parse_resource_version(&s) {
            Some(n) => prop_assert_eq!(n.to_string(), s),
            None => prop_assert!(
                s.is_empty() || s.starts_with('0') && s.len() > 1
                    || !s.bytes().all(|b| b.is_ascii_digit()) || s.parse::<i64>().is_err(),
                "{s:?} refused"
            ),
        }
    }

    /// The controller reads Leases and claims through DeserializeGuard, which relies on
    /// deserialization returning an error (never panicking) for any shape; whatever
    /// does deserialize survives a round trip unchanged.
    #[test]
    fn any_lease_shaped_json_deserializes_or_errors(value in object_like("Lease")) {
        if let Ok(lease) = serde_json::from_value::<Lease>(value) {
            let again: Lease = serde_json::from_value(serde_json::to_value(&lease).unwrap()).unwrap();
            prop_assert_eq!(again, lease);
        }
    }

    #[test]
    fn any_claim_shaped_json_deserializes_or_errors(value in object_like("LeaseClaim")) {
        if let Ok(claim) = serde_json::from_value::<LeaseClaim>(value) {
            let again = serde_json::to_value(&claim).unwrap();
            let again: LeaseClaim = serde_json::from_value(again).unwrap();
            prop_assert_eq!(again.spec, claim.spec);
        }
    }
}

proptest! {
    // Each case starts a process.
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// `palisade fence` reads its token from the environment that `palisade lock`
    /// sets: any value either works or exits 2 naming the variable's problem.
    #[test]
    fn fence_cli_token_from_environment(token in "[0-9]{1,3}|[^\\x00]{0,8}") {
        let dir = tempfile::tempdir().unwrap();
        palisade::fence::FileStore::create(dir.path().join("store")).unwrap();
        let output = support::cli::palisade()
            .args(["fence", "--store"])
            .arg(dir.path().join("store"))
            .env("PALISADE_FENCING_TOKEN", &token)
            .env("PALISADE_LEASE", "k")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        match parse_token(&token) {
            Ok(_) => prop_assert!(output.status.success(), "{token:?}: {stderr}"),
            Err(_) => {
                prop_assert_eq!(output.status.code(), Some(2), "{:?}: {}", token, stderr);
                prop_assert!(stderr.contains("token"), "{token:?}: {stderr}");
            }
        }
    }
}
