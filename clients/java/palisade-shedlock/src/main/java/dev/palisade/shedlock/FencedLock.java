package dev.palisade.shedlock;

import dev.palisade.Grant;
import net.javacrumbs.shedlock.core.SimpleLock;

/**
 * A ShedLock lock held as a palisade Lease: {@link PalisadeLockProvider#lock} returns
 * one (as a {@link SimpleLock}; cast it when calling the provider directly). Inside a
 * task run by ShedLock, {@link PalisadeLockProvider#currentGrant()} finds it.
 */
public interface FencedLock extends SimpleLock {
    /** The grant of the Lease: its token, and whether it is still held. */
    Grant grant();

    /** The fencing token: send it with every write the lock protects. */
    default long token() {
        return grant().token();
    }
}
