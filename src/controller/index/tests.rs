use super::*;
use crate::fixtures::{ClaimBuilder, LeaseBuilder, PodBuilder};
use k8s_openapi::jiff::Timestamp;

fn sorted(mut keys: Vec<LeaseKey>) -> Vec<LeaseKey> {
    keys.sort();
    keys.dedup();
    keys
}

#[test]
fn a_pod_is_gone_when_deleting_replaced_or_terminal_and_only_then() {
    let running = PodBuilder::new("p").uid("u1").phase("Running").build();
    assert_eq!(PodEntry::of(&running).problem(Some("u1")), None);
    assert_eq!(PodEntry::of(&running).problem(None), None);
    assert_eq!(
        PodEntry::of(&running).problem(Some("u0")),
        Some(PodProblem::Replaced)
    );
    for phase in ["Succeeded", "Failed"] {
        let done = PodBuilder::new("p").uid("u1").phase(phase).build();
        assert_eq!(
            PodEntry::of(&done).problem(Some("u1")),
            Some(PodProblem::Terminal(phase.into()))
        );
    }
    let mut deleting = running.clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    assert_eq!(
        PodEntry::of(&deleting).problem(Some("u1")),
        Some(PodProblem::Gone)
    );
}

#[test]
fn a_lease_is_held_slim_whichever_path_delivered_it() {
    // A write's response carries managedFields; the watch event of the same
    // resourceVersion (slimmed) is then skipped as unchanged, so the index must
    // slim what it is given or hold the fat copy for the Lease's lifetime.
    let now = Instant::now();
    let key = LeaseKey::new("ns", "a");
    let mut index = Index::default();
    let written = LeaseBuilder::new("a")
        .uid("La")
        .resource_version(1)
        .managed_fields(vec![Default::default()])
        .build();
    index.apply_lease(written, now);
    assert_eq!(index.lease(&key).unwrap().metadata.managed_fields, None);
}

#[test]
fn the_index_is_synced_once_every_kind_has_listed() {
    let now = Instant::now();
    let mut index = Index::default();
    let lease = LeaseBuilder::new("a").uid("La").resource_version(1).build();
    index.handle(Event::<Lease>::Init, now);
    index.handle(Event::InitApply(lease), now);
    index.handle(Event::<Lease>::InitDone, now);
    index.handle(Event::<LeaseClaim>::Init, now);
    index.handle(Event::<LeaseClaim>::InitDone, now);
    assert!(!index.is_synced(), "pods not listed yet");
    index.handle(Event::<Pod>::Init, now);
    index.handle(Event::<Pod>::InitDone, now);
    assert!(index.is_synced());
}

#[test]
fn a_relist_forgets_what_it_did_not_deliver_of_its_own_kind_only() {
    let now = Instant::now();
    let a = LeaseKey::new("ns", "a");
    let b = LeaseKey::new("ns", "b");
    let lease_a = LeaseBuilder::new("a").uid("La").resource_version(1).build();
    let lease_b = LeaseBuilder::new("b").uid("Lb").resource_version(2).build();
    let c1 = ClaimBuilder::new("c1", "a")
        .uid("u-c1")
        .resource_version(1)
        .pod("p1")
        .build();
    let c2 = ClaimBuilder::new("c2", "b")
        .uid("u-c2")
        .resource_version(1)
        .pod("p2")
        .build();
    let p1 = PodBuilder::new("p1").uid("p-p1").phase("Running").build();
    let p2 = PodBuilder::new("p2").uid("p-p2").phase("Running").build();
    let mut index = Index::default();
    index.handle(Event::Apply(lease_a.clone()), now);
    index.handle(Event::Apply(lease_b), now);
    assert_eq!(index.handle(Event::Apply(c1), now), vec![a.clone()]);
    index.handle(Event::Apply(c2.clone()), now);
    assert_eq!(index.handle(Event::Apply(p1), now), vec![a.clone()]);
    index.handle(Event::Apply(p2), now);

    // Leases relisted without "b" (deleted while the watch was down): "b" keeps its claim.
    index.handle(Event::<Lease>::Init, now);
    assert_eq!(
        index.handle(Event::InitApply(lease_a.clone()), now),
        Vec::<LeaseKey>::new(),
        "an unchanged object changes no decision"
    );
    assert_eq!(index.handle(Event::<Lease>::InitDone, now), vec![b.clone()]);
    assert!(index.lease(&b).is_none());
    assert_eq!(index.claim_uid("ns", "c2"), Some("u-c2"));
    assert_eq!(index.lease_count(), 1);

    // Claims relisted without "c1".
    index.handle(Event::<LeaseClaim>::Init, now);
    index.handle(Event::InitApply(c2), now);
    assert_eq!(
        index.handle(Event::<LeaseClaim>::InitDone, now),
        vec![a.clone()]
    );
    assert_eq!(index.claim_uid("ns", "c1"), None);

    // Pods relisted without either: only the Lease with a claim naming one is touched.
    index.handle(Event::<Pod>::Init, now);
    assert_eq!(sorted(index.handle(Event::<Pod>::InitDone, now)), vec![b]);
    assert_eq!(index.pod_uid("ns", "p1"), None);
    assert_eq!(index.pod_uid("ns", "p2"), None);

    // A delete goes through the same entry point.
    let gone = lease_a;
    assert_eq!(index.handle(Event::Delete(gone), now), vec![a]);
    assert_eq!(index.lease_count(), 0);
    assert_eq!(index.counts_by_walking(), Counts::default());
}

#[test]
fn the_queue_counts_follow_the_leases_waiting_counts_without_a_walk() {
    let now = Instant::now();
    let mut index = Index::default();
    let lease = |name: &str, rv: u64, waiting: i64| {
        LeaseBuilder::new(name)
            .uid(&format!("L{name}"))
            .resource_version(rv)
            .waiting_count(waiting)
            .build()
    };
    let check = |index: &Index, waiting: usize, longest: usize| {
        assert_eq!(
            (index.waiting_count(), index.longest_queue()),
            (waiting, longest)
        );
        assert_eq!(index.counts_by_walking().waiting, waiting);
        assert_eq!(index.longest_queue_by_walking(), longest);
    };
    check(&index, 0, 0);
    index.apply_lease(lease("a", 1, 3), now);
    index.apply_lease(lease("b", 1, 3), now);
    index.apply_lease(lease("c", 1, 1), now);
    check(&index, 7, 3);
    // One of the two longest shrinks: the other is still the longest.
    index.apply_lease(lease("a", 2, 0), now);
    check(&index, 4, 3);
    // The longest shrinks below the next one.
    index.apply_lease(lease("b", 2, 2), now);
    check(&index, 3, 2);
    // An older event of b changes nothing.
    index.apply_lease(lease("b", 1, 9), now);
    check(&index, 3, 2);
    // Deleted, and gone while the watch was down.
    index.delete_lease(&lease("b", 2, 2));
    check(&index, 1, 1);
    index.handle(Event::<Lease>::Init, now);
    index.handle(Event::InitApply(lease("a", 2, 0)), now);
    index.handle(Event::<Lease>::InitDone, now);
    check(&index, 0, 0);
    // Re-created under the same name before the old one's delete event arrived.
    index.apply_lease(lease("d", 1, 5), now);
    let mut recreated = lease("d", 7, 2);
    recreated.metadata.uid = Some("Ld-2".into());
    index.apply_lease(recreated, now);
    check(&index, 2, 2);
}

/// A deleted pod that a claim names is kept as a tombstone, final for its UID (no
/// quorum read needed), and forgotten with the last claim that names it; a relist
/// that leaves it out makes it missing again, which is not final.
#[test]
fn a_deleted_pod_is_final_while_a_claim_names_it_and_forgotten_after() {
    let now = Instant::now();
    let mut index = Index::default();
    let key = LeaseKey::new("ns", "a");
    let pod = PodBuilder::new("p").uid("pu").phase("Running").build();
    let named = ClaimBuilder::new("c", "a")
        .uid("cu")
        .pod_with_uid("p", "pu")
        .build();
    index.apply_pod(&pod);
    index.apply_claim(named.clone(), now);
    let certain = |index: &Index| {
        let view = index.view(&key, now).unwrap();
        (
            view.claims[0].pod_problem.clone(),
            view.claims[0].pod_gone_for_certain,
        )
    };
    assert_eq!(certain(&index), (None, false));
    index.delete_pod(&pod);
    assert_eq!(certain(&index), (Some(PodProblem::Gone), true));
    index.retain_pods(&HashSet::new());
    assert!(!certain(&index).1, "final after a relist");

    index.apply_pod(&pod);
    index.delete_pod(&pod);
    index.delete_claim(&named);
    assert_eq!(
        index.pod_uid("ns", "p"),
        None,
        "a tombstone outlived its claims"
    );
}
