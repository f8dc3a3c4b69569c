//! Prints docs/crd-reference.md (`make crds` writes it; see `support::crd_reference`).

fn main() {
    print!("{}", palisade_test_support::crd_reference::markdown());
}
