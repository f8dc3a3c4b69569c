//! The checked-in CRDs are generated from the Rust types and must not drift.

use palisade::api::crds_yaml;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/palisade.dev.yaml");
    let on_disk = std::fs::read_to_string(path).expect("crds/palisade.dev.yaml exists");
    assert!(
        on_disk == crds_yaml(),
        "crds/palisade.dev.yaml is out of date with src/api.rs: run `make crds`"
    );
}
