package dev.palisade.jdbc;

import dev.palisade.AcquireOptions;
import dev.palisade.Grant;
import dev.palisade.Session;
import dev.palisade.SessionOptions;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.nio.file.Path;
import java.sql.Connection;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/** JdbcFence with real grants of a real agent ($PALISADE_AGENT_SOCKET). */
@Tag("postgres")
@Tag("agent")
class JdbcFenceGrantTest {

    static Session openSession() {
        String socket = System.getenv("PALISADE_AGENT_SOCKET");
        if (socket == null || socket.isEmpty()) {
            fail("PALISADE_AGENT_SOCKET is not set: these tests need a running palisade agent (see README.md, Tests)");
        }
        return Session.open(SessionOptions.defaults().socket(Path.of(socket)).name("palisade-jdbc-tests"));
    }

    @Test
    void aGrantFencesUnderNamespaceSlashLeaseAndItsSuccessorRefusesIt() throws Exception {
        String lease = "jdbc-" + UUID.randomUUID().toString().substring(0, 8);
        try (Session session = openSession(); Connection c = TestDatabase.connect()) {
            c.setAutoCommit(false);
            Grant first = session.acquire(lease, AcquireOptions.defaults());
            String key = JdbcFence.key(first);
            assertEquals(session.namespace() + "/" + lease, key);
            JdbcFence.check(c, first);
            c.commit();
            long stale = first.token();
            first.release();

            try (Grant second = session.acquire(lease, AcquireOptions.defaults())) {
                assertTrue(second.token() > stale, "tokens increase: " + second.token() + " after " + stale);
                JdbcFence.check(c, second);
                c.commit();
                // The first holder, paused past its release, comes back with its old token.
                StaleTokenException e = assertThrows(StaleTokenException.class, () -> JdbcFence.check(c, key, stale));
                assertEquals(key, e.key());
                assertEquals(stale, e.token());
                assertEquals(second.token(), e.highest().orElseThrow());
                c.rollback();
                assertEquals(second.token(), JdbcFenceTest.mark(c, key));
            }
        }
    }
}
