//! The controller's work queue: which Leases need a decision, and when.
//!
//! A key is *dirty* when something its decision depends on changed (a watch event, a
//! write's outcome, a timer). [`WorkQueue::next_ready`] hands dirty keys out in the
//! order they first became dirty, skipping keys with a pass in flight: such a key
//! stays queued and is handed out after [`WorkQueue::finish`], so no two passes for
//! the same Lease ever run at once. Each key has at most one timer (its holder's
//! expiry, a pod recheck or a retry); [`WorkQueue::schedule`] replaces it.
//!
//! Beside the dirty keys, a second, lower class of work: keys whose claim mirrors
//! are due ([`WorkQueue::defer`]). [`WorkQueue::next_deferred`] hands one out only
//! when no key is dirty at all, so mirror writes never go ahead of a decision (a
//! grant, an expiry) under load, and a key is deferred once however often, so its
//! mirrors are written once, from the latest decision, however many grants passed.
//!
//! The timers run on tokio's clock, so tests drive them on paused time.
//!
//! # Storms: only the Lease write is urgent
//!
//! When many grants end at once (a node with hundreds of holders dies, a partition)
//! the API server's write rate is the limit, and of a handover's writes only the
//! Lease is on the critical path when the holder had renewed its grant (its quorum
//! read was made in the sixth of a duration before: `index::holder`, "Expiry is one
//! write"); otherwise the ended holder's claim is too (conditioned on its
//! resourceVersion, before the Lease, so a renewal racing the expiry keeps the
//! grant). The client learns of its grant from the Lease and of its loss from
//! either, and its renewals count before its own mirror is written (DESIGN.md,
//! "Client deadlines"), so the other claims' mirrors (the new holder's `Granted`,
//! each waiter's `position`, a superseded or pod-gone claim's `Revoked`) are
//! deferred: a Lease whose mirrors are due joins the lower queue, served only when
//! no Lease is dirty and on at most half of `--concurrency`, so a grant that comes
//! up always finds a slot. Its mirrors are decided afresh from the index when
//! written, so they are coalesced (one write per claim, the latest state), never
//! older than a status already written (passes for one Lease never overlap, and the
//! index holds every write made), and never written for a claim whose deletion the
//! controller has seen; nothing needs dropping, since the queue holds at most one
//! entry per Lease (`palisade_claim_mirrors_deferred`).
//!
//! Events wait too: no Event create starts while a decision waits or is written;
//! the queue of 1,024 drops and counts beyond that (`palisade_events_dropped_total`).
//! Events are not coalesced: each records a distinct fact (token N granted to X).
//! What a user sees in a storm: `kubectl get leases.palisade.dev` is current
//! (holder, token, waiting); `kubectl get plc` may show a new holder as `Pending` and
//! stale queue positions for as long as grants keep coming, then catches up in one
//! write per claim; Events arrive after the grants they describe. Tests: this
//! module's (order, slots), the `mirrors` tests of `control_loop`, and the model in
//! `model_tests` (per controller, no claim's status ever moves back along its
//! lifecycle, and no write to a claim it has seen deleted).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::Instant;

use futures::StreamExt;
use tokio_util::time::{DelayQueue, delay_queue};

pub struct WorkQueue<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    /// When each queued key first became dirty: the start of a handover's latency.
    dirty_since: HashMap<K, Instant>,
    in_flight: HashSet<K>,
    timers: DelayQueue<K>,
    timer_keys: HashMap<K, delay_queue::Key>,
    deferred: VecDeque<K>,
    deferred_set: HashSet<K>,
}

impl<K> Default for WorkQueue<K> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            queued: HashSet::new(),
            dirty_since: HashMap::new(),
            in_flight: HashSet::new(),
            timers: DelayQueue::new(),
            timer_keys: HashMap::new(),
            deferred: VecDeque::new(),
            deferred_set: HashSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    /// Queues `key` for a decision, once however often it is marked before it is handed out.
    pub fn mark_dirty(&mut self, key: K, now: Instant) {
        self.dirty_since.entry(key.clone()).or_insert(now);
        if self.queued.insert(key.clone()) {
            self.queue.push_back(key);
        }
    }

    /// Takes the first dirty key that has no pass in flight, with when it became dirty.
    pub fn next_ready(&mut self, now: Instant) -> Option<(K, Instant)> {
        let key = take_first_idle(&mut self.queue, &self.in_flight)?;
        self.queued.remove(&key);
        let dirty_since = self.dirty_since.remove(&key).unwrap_or(now);
        Some((key, dirty_since))
    }

    /// A pass for `key` is in flight: [`WorkQueue::next_ready`] skips it until [`WorkQueue::finish`].
    pub fn start(&mut self, key: K) {
        self.in_flight.insert(key);
    }

    /// The pass for `key` is done; if it was marked dirty meanwhile, it is ready again.
    pub fn finish(&mut self, key: &K) {
        self.in_flight.remove(key);
    }

    // Only the tests ask.
    #[cfg(test)]
    pub fn is_in_flight(&self, key: &K) -> bool {
        self.in_flight.contains(key)
    }

    /// Keys waiting to be handed out (in flight or not).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// `key`'s claim mirrors are due: written when no key is dirty.
    pub fn defer(&mut self, key: K) {
        if self.deferred_set.insert(key.clone()) {
            self.deferred.push_back(key);
        }
    }

    /// Takes the first deferred key that is neither dirty nor in flight, but only when
    /// no key is dirty at all (a dirty key is decided first, mirrors included).
    pub fn next_deferred(&mut self) -> Option<K> {
        if !self.queue.is_empty() {
            return None;
        }
        let key = take_first_idle(&mut self.deferred, &self.in_flight)?;
        self.deferred_set.remove(&key);
        Some(key)
    }

    /// Keys whose mirrors wait.
    pub fn deferred_len(&self) -> usize {
        self.deferred.len()
    }

    /// Wakes `key` at `at` (its holder's expiry, or a retry), replacing any earlier
    /// timer; None only cancels it.
    pub fn schedule(&mut self, key: &K, at: Option<Instant>) {
        if let Some(old) = self.timer_keys.remove(key) {
            self.timers.remove(&old);
        }
        if let Some(at) = at {
            let handle = self.timers.insert_at(key.clone(), at.into());
            self.timer_keys.insert(key.clone(), handle);
        }
    }

    /// Waits for the next timer and marks its key dirty; None at once when no timer is set.
    pub async fn expired(&mut self) -> Option<K> {
        let key = self.timers.next().await?.into_inner();
        self.timer_keys.remove(&key);
        self.mark_dirty(key.clone(), tokio::time::Instant::now().into_std());
        Some(key)
    }
}

/// Removes and returns the first of `keys` that has no pass in flight.
fn take_first_idle<K: Eq + Hash>(keys: &mut VecDeque<K>, in_flight: &HashSet<K>) -> Option<K> {
    let position = keys.iter().position(|k| !in_flight.contains(k))?;
    keys.remove(position)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{advance, timeout};

    use super::*;

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_marked_twice_is_handed_out_once_since_its_first_mark() {
        let mut q = WorkQueue::default();
        let first = now();
        q.mark_dirty("a", first);
        advance(Duration::from_secs(1)).await;
        q.mark_dirty("b", now());
        q.mark_dirty("a", now());
        assert_eq!(q.len(), 2);
        assert_eq!(q.next_ready(now()), Some(("a", first)));
        assert_eq!(q.next_ready(now()).map(|(k, _)| k), Some("b"));
        assert_eq!(q.next_ready(now()), None);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_flight_waits_in_the_queue_until_its_pass_finishes() {
        let mut q = WorkQueue::default();
        q.mark_dirty("a", now());
        let (a, _) = q.next_ready(now()).unwrap();
        q.start(a);
        // Dirty again while its pass runs: others go first, "a" keeps its place.
        let marked = now();
        q.mark_dirty("a", marked);
        q.mark_dirty("b", now());
        assert_eq!(q.next_ready(now()).map(|(k, _)| k), Some("b"));
        assert_eq!(
            q.next_ready(now()),
            None,
            "no second pass for a key in flight"
        );
        assert!(q.is_in_flight(&"a"));
        q.finish(&"a");
        assert!(!q.is_in_flight(&"a"));
        assert_eq!(q.next_ready(now()), Some(("a", marked)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_marks_its_key_dirty_when_it_is_due_and_not_before() {
        let mut q = WorkQueue::default();
        let start = now();
        q.schedule(&"a", Some(start + Duration::from_secs(1)));
        assert!(
            timeout(Duration::from_millis(999), q.expired())
                .await
                .is_err()
        );
        assert_eq!(q.next_ready(now()), None);
        assert_eq!(q.expired().await, Some("a"));
        assert_eq!(now() - start, Duration::from_secs(1));
        assert_eq!(q.next_ready(now()).map(|(k, _)| k), Some("a"));
        // Nothing left to fire: the wait ends at once instead of hanging.
        assert_eq!(q.expired().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn scheduling_again_replaces_the_timer_and_none_cancels_it() {
        let mut q = WorkQueue::default();
        let start = now();
        q.schedule(&"a", Some(start + Duration::from_secs(5)));
        q.schedule(&"a", Some(start + Duration::from_secs(1)));
        q.schedule(&"b", Some(start + Duration::from_secs(2)));
        q.schedule(&"b", None);
        assert_eq!(q.expired().await, Some("a"));
        assert_eq!(now() - start, Duration::from_secs(1));
        assert_eq!(
            q.expired().await,
            None,
            "the replaced and the cancelled timers are gone"
        );
        // A later timer replaces an earlier one too.
        q.schedule(&"a", Some(now() + Duration::from_secs(1)));
        q.schedule(&"a", Some(now() + Duration::from_secs(3)));
        let before = now();
        assert_eq!(q.expired().await, Some("a"));
        assert_eq!(now() - before, Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn deferred_keys_wait_until_no_key_is_dirty_and_come_out_once() {
        let mut q = WorkQueue::default();
        q.defer("m1");
        q.defer("m2");
        q.defer("m1");
        assert_eq!(q.deferred_len(), 2, "deferred twice, queued once");
        q.mark_dirty("a", now());
        assert_eq!(q.next_deferred(), None, "a dirty key goes first");
        let (a, _) = q.next_ready(now()).unwrap();
        q.start(a);
        assert_eq!(
            q.next_deferred(),
            Some("m1"),
            "nothing dirty: mirrors may go"
        );
        // A dirty key in flight still counts: its pass will be decided again.
        q.mark_dirty("a", now());
        assert_eq!(q.next_deferred(), None);
        q.finish(&"a");
        assert_eq!(q.next_ready(now()).map(|(k, _)| k), Some("a"));
        assert_eq!(q.next_deferred(), Some("m2"));
        assert_eq!(q.next_deferred(), None);
        assert_eq!(q.deferred_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_key_with_a_pass_in_flight_waits_for_it() {
        let mut q = WorkQueue::default();
        q.mark_dirty("a", now());
        let (a, _) = q.next_ready(now()).unwrap();
        q.start(a);
        q.defer("a");
        q.defer("b");
        assert_eq!(q.next_deferred(), Some("b"), "a is in flight: b goes first");
        assert_eq!(q.next_deferred(), None);
        q.finish(&"a");
        assert_eq!(q.next_deferred(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_timer_of_a_key_in_flight_runs_after_its_pass() {
        let mut q = WorkQueue::default();
        q.mark_dirty("a", now());
        let (a, _) = q.next_ready(now()).unwrap();
        q.start(a);
        q.schedule(&"a", Some(now()));
        assert_eq!(q.expired().await, Some("a"));
        assert_eq!(q.next_ready(now()), None);
        q.finish(&"a");
        assert_eq!(q.next_ready(now()).map(|(k, _)| k), Some("a"));
    }
}
