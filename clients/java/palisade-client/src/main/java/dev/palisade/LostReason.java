package dev.palisade;

/** Why a grant ended: the agent's reasons, the client's own, and {@link #RELEASED}. */
public enum LostReason {
    /** The claim was revoked (e.g. by an administrator). */
    REVOKED("Revoked"),
    /** The Lease expired before a renewal counted. */
    EXPIRED("Expired"),
    /** Another claim holds the Lease now. */
    SUPERSEDED("Superseded"),
    /** The Lease was deleted. */
    LEASE_DELETED("LeaseDeleted"),
    /** The claim was deleted. */
    CLAIM_DELETED("ClaimDeleted"),
    /** validForMs ran out before an answer showed the grant still held (the agent's or this client's clock). */
    LOCAL_DEADLINE("LocalDeadline"),
    /** The acquire failed before a grant (the API server refused the claim). */
    ACQUIRE_FAILED("AcquireFailed"),
    /** The session ended: its event stream closed, or the agent no longer knows it. */
    SESSION_ENDED("SessionEnded"),
    /** No keepalive of the session succeeded within its keepaliveMs. */
    KEEPALIVE_MISSED("KeepaliveMissed"),
    /** Released by this process (or with its session's close): not a loss. */
    RELEASED("Released");

    private final String wire;

    LostReason(String wire) {
        this.wire = wire;
    }

    /** The name in the agent's API (e.g. {@code "LocalDeadline"}). */
    public String wireName() {
        return wire;
    }

    /** The reason named {@code s} in the agent's API; IllegalArgumentException for an unknown name. */
    public static LostReason fromWire(String s) {
        for (LostReason r : values()) {
            if (r.wire.equals(s)) {
                return r;
            }
        }
        throw new IllegalArgumentException("not a palisade loss reason: " + s);
    }

    /** Like fromWire, but a reason this client does not know (a newer agent's) reads as REVOKED. */
    static LostReason fromWireOrRevoked(String s) {
        if (s == null) {
            return REVOKED;
        }
        try {
            return fromWire(s);
        } catch (IllegalArgumentException e) {
            return REVOKED;
        }
    }
}
