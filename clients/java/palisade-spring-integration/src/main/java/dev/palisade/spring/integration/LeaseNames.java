package dev.palisade.spring.integration;

import java.time.Duration;
import java.util.regex.Pattern;

/** Lock keys as palisade Lease names (DNS labels, as the agent's OpenAPI says), and ttls as durations. */
final class LeaseNames {
    private static final Pattern DNS_LABEL = Pattern.compile("[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?");

    /** The agent's bounds of durationSeconds. */
    static final long MIN_DURATION_SECONDS = 1;
    static final long MAX_DURATION_SECONDS = 86_400;

    private LeaseNames() {}

    /** The key itself when it is a String that is a DNS label, else an exception naming it (never a mangled name). */
    static String require(Object key) {
        if (!(key instanceof String name)) {
            throw new IllegalArgumentException("lock key " + key + " (" + (key == null ? "null" : key.getClass().getName())
                    + ") is not a palisade Lease name: the key must be a String that is a DNS label");
        }
        if (!DNS_LABEL.matcher(name).matches()) {
            throw new IllegalArgumentException("lock key \"" + name + "\" is not a palisade Lease name: a Lease name is a "
                    + "DNS label (at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit)");
        }
        return name;
    }

    /** A ttl as the Lease's durationSeconds: rounded up, within the agent's 1..86400. */
    static int durationSeconds(Duration ttl) {
        long seconds = ttl.getSeconds() + (ttl.getNano() > 0 ? 1 : 0);
        return (int) Math.max(MIN_DURATION_SECONDS, Math.min(MAX_DURATION_SECONDS, seconds));
    }
}
