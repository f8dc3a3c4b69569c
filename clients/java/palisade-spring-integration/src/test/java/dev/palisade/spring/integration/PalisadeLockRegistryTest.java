package dev.palisade.spring.integration;

import dev.palisade.AcquireOptions;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.concurrent.locks.Lock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** What needs no agent: keys, the lock object, misuse. obtain() asks the agent nothing. */
class PalisadeLockRegistryTest {
    private final PalisadeLockRegistry registry = new PalisadeLockRegistry();

    @Test
    void oneLockPerKey() {
        PalisadeLock orders = registry.obtain("orders");
        assertSame(orders, registry.obtain("orders"));
        assertNotSame(orders, registry.obtain("invoices"));
        assertEquals("orders", orders.name());
        assertFalse(orders.isHeldByCurrentThread());
    }

    @Test
    void keysThatAreNotDnsLabelsAreRefusedByName() {
        for (String key : new String[] {"", "Orders", "orders_eu", "orders.eu", "-orders", "orders-", "x".repeat(64)}) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> registry.obtain(key));
            assertTrue(e.getMessage().contains("\"" + key + "\"") && e.getMessage().contains("DNS label"), e.getMessage());
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> registry.obtain(42));
        assertTrue(e.getMessage().contains("42") && e.getMessage().contains("java.lang.Integer"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> registry.obtain(null));
    }

    @Test
    void aThreadThatDoesNotHoldTheLockCannotUnlockItOrReadItsToken() {
        PalisadeLock lock = registry.obtain("orders");
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
        assertThrows(IllegalMonitorStateException.class, lock::grant);
        assertThrows(IllegalMonitorStateException.class, lock::token);
    }

    @Test
    void conditionsAreUnsupported() {
        Lock lock = registry.obtain("orders");
        assertThrows(UnsupportedOperationException.class, lock::newCondition);
    }

    @Test
    void aTtlIsTheDurationInWholeSecondsWithinTheAgentsBounds() {
        assertEquals(30, LeaseNames.durationSeconds(Duration.ofSeconds(30)));
        assertEquals(31, LeaseNames.durationSeconds(Duration.ofMillis(30_001)), "rounded up, never shorter");
        assertEquals(1, LeaseNames.durationSeconds(Duration.ofMillis(1)));
        assertEquals(1, LeaseNames.durationSeconds(Duration.ZERO));
        assertEquals(86_400, LeaseNames.durationSeconds(Duration.ofDays(3)), "capped at the agent's maximum");
    }

    @Test
    void aNegativeTryLockTimeoutIsRefused() {
        assertThrows(IllegalArgumentException.class,
                () -> new PalisadeLockRegistry(AcquireOptions.defaults(), Duration.ofMillis(-1)));
    }
}
