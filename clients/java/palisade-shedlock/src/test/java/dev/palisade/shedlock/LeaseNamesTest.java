package dev.palisade.shedlock;

import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import org.junit.jupiter.api.Test;

import java.time.Duration;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Lock names and options, mapped without an agent. */
class LeaseNamesTest {

    @Test
    void dnsLabelsAreLeaseNamesAsTheyAre() {
        for (String name : new String[] {"a", "report", "report-daily", "0day", "x".repeat(63), "a-1-b"}) {
            assertEquals(name, LeaseNames.require(name));
        }
    }

    @Test
    void everyOtherNameIsRefusedByName() {
        for (String name : new String[] {"", "reportDaily", "report_daily", "report.daily", "-report", "report-",
                "x".repeat(64), "rapport-é", "report daily"}) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> LeaseNames.require(name));
            assertTrue(e.getMessage().contains("\"" + name + "\"") && e.getMessage().contains("DNS label"), e.getMessage());
        }
        assertThrows(IllegalArgumentException.class, () -> LeaseNames.require(null));
    }

    @Test
    void theProviderRefusesABadNameBeforeAskingTheAgent() {
        // The default session would be opened on the first acquire: with no agent
        // anywhere, reaching it would fail with AgentUnreachableException instead.
        PalisadeLockProvider provider = new PalisadeLockProvider();
        LockConfiguration config = new LockConfiguration(ClockProvider.now(), "nightlyReport", Duration.ofMinutes(5), Duration.ZERO);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> provider.lock(config));
        assertTrue(e.getMessage().contains("\"nightlyReport\""), e.getMessage());
    }

    @Test
    void lockAtMostForIsTheDurationInWholeSecondsWithinTheAgentsBounds() {
        assertEquals(15, PalisadeLockProvider.durationSeconds(Duration.ofSeconds(15)));
        assertEquals(16, PalisadeLockProvider.durationSeconds(Duration.ofMillis(15_001)), "rounded up, never shorter");
        assertEquals(1, PalisadeLockProvider.durationSeconds(Duration.ofMillis(500)));
        assertEquals(1, PalisadeLockProvider.durationSeconds(Duration.ZERO));
        assertEquals(86_400, PalisadeLockProvider.durationSeconds(Duration.ofDays(1)));
        assertEquals(86_400, PalisadeLockProvider.durationSeconds(Duration.ofHours(30)), "capped at the agent's maximum");
    }

    @Test
    void aNegativeAcquireTimeoutIsRefused() {
        assertThrows(IllegalArgumentException.class,
                () -> new PalisadeLockProvider(dev.palisade.AcquireOptions.defaults(), Duration.ofSeconds(-1)));
    }
}
