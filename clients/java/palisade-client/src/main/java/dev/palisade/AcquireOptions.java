package dev.palisade;

import java.util.Objects;
import java.util.Optional;

/**
 * How to acquire a Lease: its namespace (default the agent's, its pod's), the Lease's
 * duration when the agent creates it, the claim's holder identity (default the pod's
 * name), and the one slot of a semaphore to wait for (default any, the lowest free).
 * Immutable: each method returns a changed copy.
 */
public final class AcquireOptions {
    private static final AcquireOptions DEFAULTS = new AcquireOptions(null, null, null, null);

    private final String namespace;
    private final Integer durationSeconds;
    private final String holderIdentity;
    private final Integer slot;

    /** The highest slot of a semaphore (a Lease has at most 64 permits). */
    public static final int MAX_SLOT = 63;

    private AcquireOptions(String namespace, Integer durationSeconds, String holderIdentity, Integer slot) {
        this.namespace = namespace;
        this.durationSeconds = durationSeconds;
        this.holderIdentity = holderIdentity;
        this.slot = slot;
    }

    /** Every option left to the agent. */
    public static AcquireOptions defaults() {
        return DEFAULTS;
    }

    /** The Lease's namespace (the agent checks it is a DNS label). */
    public AcquireOptions namespace(String ns) {
        return new AcquireOptions(nonEmpty(ns, "namespace"), durationSeconds, holderIdentity, slot);
    }

    /** The Lease's duration when the agent creates it, 1..86400 s; an existing Lease keeps its own. */
    public AcquireOptions durationSeconds(int seconds) {
        if (seconds < 1 || seconds > 86_400) {
            throw new IllegalArgumentException("durationSeconds must be within 1..86400, not " + seconds);
        }
        return new AcquireOptions(namespace, seconds, holderIdentity, slot);
    }

    /** The claim's holder identity (at most 253 characters). */
    public AcquireOptions holderIdentity(String id) {
        nonEmpty(id, "holderIdentity");
        if (id.length() > 253) {
            throw new IllegalArgumentException("holderIdentity must be at most 253 characters, not " + id.length());
        }
        return new AcquireOptions(namespace, durationSeconds, id, slot);
    }

    /**
     * Only this slot of a semaphore, 0..63, for work sharded by slot; a lock has slot 0
     * only, and a slot at or above the Lease's permits waits until they are raised.
     */
    public AcquireOptions slot(int slot) {
        if (slot < 0 || slot > MAX_SLOT) {
            throw new IllegalArgumentException("slot must be within 0.." + MAX_SLOT + ", not " + slot);
        }
        return new AcquireOptions(namespace, durationSeconds, holderIdentity, slot);
    }

    /** The slot given, if any. */
    public Optional<Integer> slot() {
        return Optional.ofNullable(slot);
    }

    /** The namespace given, if any. */
    public Optional<String> namespace() {
        return Optional.ofNullable(namespace);
    }

    /** The duration given, if any. */
    public Optional<Integer> durationSeconds() {
        return Optional.ofNullable(durationSeconds);
    }

    /** The holder identity given, if any. */
    public Optional<String> holderIdentity() {
        return Optional.ofNullable(holderIdentity);
    }

    private static String nonEmpty(String value, String option) {
        if (value == null || value.isEmpty()) {
            throw new IllegalArgumentException(option + " must be a non-empty string");
        }
        return value;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof AcquireOptions other
                && Objects.equals(namespace, other.namespace)
                && Objects.equals(durationSeconds, other.durationSeconds)
                && Objects.equals(holderIdentity, other.holderIdentity)
                && Objects.equals(slot, other.slot);
    }

    @Override
    public int hashCode() {
        return Objects.hash(namespace, durationSeconds, holderIdentity, slot);
    }

    @Override
    public String toString() {
        return "AcquireOptions[namespace=" + namespace + ", durationSeconds=" + durationSeconds
                + ", holderIdentity=" + holderIdentity + ", slot=" + slot + "]";
    }
}
