package dev.palisade.shedlock;

import java.util.regex.Pattern;

/** palisade Lease names are DNS labels (RFC 1123), as the agent's OpenAPI says. */
final class LeaseNames {
    private static final Pattern DNS_LABEL = Pattern.compile("[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?");

    private LeaseNames() {}

    /** {@code name} itself when it is a DNS label, else an exception naming it (never a mangled name). */
    static String require(String name) {
        if (name == null || !DNS_LABEL.matcher(name).matches()) {
            throw new IllegalArgumentException("ShedLock lock name \"" + name + "\" is not a palisade Lease name: "
                    + "a Lease name is a DNS label (at most 63 characters of a-z, 0-9 and '-', starting and ending "
                    + "with a letter or digit); rename the lock, e.g. @SchedulerLock(name = \"report-daily\")");
        }
        return name;
    }
}
