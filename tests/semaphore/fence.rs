//! `palisade fence --slot` and `PALISADE_SLOT`: a semaphore slot's token is fenced
//! under that slot's key. No cluster needed.

use std::path::Path;
use std::process::Output;

use palisade::fence::{Fence, FileStore};
use support::cli::palisade;

/// `palisade fence --store STORE ARGS...` with these variables (as `palisade lock`
/// sets them) in its environment.
fn fence(store: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    palisade()
        .args(["fence", "--store"])
        .arg(store)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run palisade fence")
}

fn highest(store: &Path, key: &str) -> Option<u64> {
    Fence::new(FileStore::open(store).unwrap())
        .highest(key)
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const LEASE: [(&str, &str); 2] = [
    ("PALISADE_NAMESPACE", "payments"),
    ("PALISADE_LEASE", "invoices"),
];

#[test]
fn a_slots_token_is_fenced_under_the_slots_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    FileStore::create(&store).unwrap();
    let with_slot = |slot| [LEASE[0], LEASE[1], ("PALISADE_SLOT", slot)];

    // From the environment, as under `palisade lock`.
    let token = ("PALISADE_FENCING_TOKEN", "30");
    let out = fence(
        &store,
        &[],
        &[LEASE[0], LEASE[1], ("PALISADE_SLOT", "2"), token],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("for key \"payments/invoices#2\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(highest(&store, "payments/invoices#2"), Some(30));
    assert_eq!(
        highest(&store, "payments/invoices"),
        None,
        "slot 0's key untouched"
    );

    // Slots are fenced apart: a lower token in another slot is admitted there.
    let out = fence(&store, &["--token", "20"], &with_slot("1"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(highest(&store, "payments/invoices#1"), Some(20));
    // ... and a lower token in the same slot is stale, the flag winning over the variable.
    let out = fence(&store, &["--token", "29", "--slot", "2"], &with_slot("1"));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // Slot 0 is a lock's key.
    let out = fence(&store, &["--token", "5"], &with_slot("0"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(highest(&store, "payments/invoices"), Some(5));
    // --key wins over the environment's slot.
    let out = fence(&store, &["--token", "1", "--key", "mine"], &with_slot("2"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(highest(&store, "mine"), Some(1));
}

/// Slots above 0 never had a bare-lease-name key, so an older mark under the lease
/// name stops only slot 0's default key.
#[test]
fn only_slot_zero_is_checked_against_the_older_default_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    FileStore::create(&store).unwrap();
    Fence::new(FileStore::open(&store).unwrap())
        .admit("invoices", 40)
        .unwrap();
    let out = fence(&store, &["--token", "41", "--slot", "0"], &LEASE);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = fence(&store, &["--token", "41", "--slot", "3"], &LEASE);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(highest(&store, "payments/invoices#3"), Some(41));
}

#[test]
fn a_bad_slot_is_refused_naming_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    FileStore::create(&store).unwrap();
    for (args, env, needle) in [
        (&["--slot", "64"][..], &LEASE[..], "--slot"),
        (&["--slot", "-1"][..], &LEASE[..], "--slot"),
        (&["--slot", "1", "--key", "k"][..], &LEASE[..], "--key"),
        (
            &[][..],
            &[LEASE[0], LEASE[1], ("PALISADE_SLOT", "x")][..],
            "PALISADE_SLOT",
        ),
        (&[][..], &[("PALISADE_SLOT", "2")][..], "PALISADE_LEASE"),
        (&["--slot", "2"][..], &[][..], "PALISADE_LEASE"),
    ] {
        let out = fence(&store, &[&["--token", "7"], args].concat(), env);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} {env:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(needle),
            "{args:?} {env:?}: {}",
            stderr(&out)
        );
    }
    let marks = Fence::new(FileStore::open(&store).unwrap())
        .marks()
        .unwrap();
    assert!(marks.is_empty(), "nothing admitted: {marks:?}");
}
