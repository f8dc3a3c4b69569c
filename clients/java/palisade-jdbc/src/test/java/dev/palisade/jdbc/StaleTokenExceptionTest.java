package dev.palisade.jdbc;

import org.junit.jupiter.api.Test;

import java.sql.SQLException;
import java.util.OptionalLong;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** How database errors become this module's exceptions (no database needed). */
class StaleTokenExceptionTest {

    @Test
    void pf001BecomesAStaleTokenExceptionNamingKeyAndTokens() {
        SQLException driver = new SQLException("ERROR: write rejected: stale fencing token 33 for key \"payments/billing\" "
                + "is lower than the highest admitted token 34\n  Detail: {\"key\" : \"payments/billing\", \"token\" : 33, "
                + "\"highest\" : 34}", "PF001");
        SQLException e = JdbcFence.classify(driver, "payments/billing", 33);
        StaleTokenException stale = (StaleTokenException) e;
        assertEquals("payments/billing", stale.key());
        assertEquals(33, stale.token());
        assertEquals(OptionalLong.of(34), stale.highest());
        assertEquals("PF001", stale.getSQLState());
        assertSame(driver, stale.getCause());
        assertEquals("write rejected: stale fencing token 33 for key \"payments/billing\" is lower than the highest "
                + "admitted token 34; the transaction is aborted: roll it back and stop writing", stale.getMessage());
    }

    @Test
    void anUnreadableHighestIsEmptyNotInvented() {
        StaleTokenException stale = (StaleTokenException) JdbcFence.classify(new SQLException("refused", "PF001"), "k", 5);
        assertEquals(OptionalLong.empty(), stale.highest());
        assertTrue(stale.getMessage().contains("stale fencing token 5 for key \"k\""), stale.getMessage());
    }

    @Test
    void aMissingInstallKeepsItsSqlStateAndSaysHow() {
        for (String state : new String[] {"3F000", "42883", "42P01"}) {
            SQLException driver = new SQLException("ERROR: schema \"palisade\" does not exist", state);
            SQLException e = JdbcFence.classify(driver, "k", 1);
            assertEquals(state, e.getSQLState());
            assertSame(driver, e.getCause());
            assertTrue(e.getMessage().contains("not installed") && e.getMessage().contains("--create"), e.getMessage());
        }
    }

    @Test
    void everyOtherErrorIsTheDriversOwn() {
        for (String state : new String[] {"40001", "55P03", "22023", "22004", null}) {
            SQLException driver = new SQLException("some failure", state);
            assertSame(driver, JdbcFence.classify(driver, "k", 1));
        }
    }
}
