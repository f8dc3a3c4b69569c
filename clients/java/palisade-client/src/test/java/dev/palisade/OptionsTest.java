package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class OptionsTest {
    private static void refused(String option, org.junit.jupiter.api.function.Executable call) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, call);
        assertTrue(e.getMessage().contains(option), "the message names " + option + ": " + e.getMessage());
    }

    @Test
    void acquireOptionsAreCheckedAndCopied() {
        AcquireOptions d = AcquireOptions.defaults();
        AcquireOptions o = d.namespace("ns").durationSeconds(6).holderIdentity("pod-1");
        assertTrue(d.namespace().isEmpty(), "withers copy");
        assertEquals("ns", o.namespace().orElseThrow());
        assertEquals(6, o.durationSeconds().orElseThrow());
        assertEquals("pod-1", o.holderIdentity().orElseThrow());
        assertEquals(1, d.durationSeconds(1).durationSeconds().orElseThrow());
        assertEquals(86_400, d.durationSeconds(86_400).durationSeconds().orElseThrow());
        refused("durationSeconds", () -> d.durationSeconds(0));
        refused("durationSeconds", () -> d.durationSeconds(86_401));
        assertEquals(0, d.slot(0).slot().orElseThrow());
        assertEquals(63, d.slot(63).slot().orElseThrow());
        assertTrue(d.slot().isEmpty(), "any slot");
        refused("slot", () -> d.slot(64));
        refused("slot", () -> d.slot(-1));
        refused("namespace", () -> d.namespace(""));
        refused("namespace", () -> d.namespace(null));
        refused("holderIdentity", () -> d.holderIdentity("x".repeat(254)));
        refused("holderIdentity", () -> d.holderIdentity(null));
    }

    @Test
    void sessionOptionsAreChecked() {
        SessionOptions d = SessionOptions.defaults();
        assertEquals(Duration.ofSeconds(1), d.keepalive(Duration.ofSeconds(1)).keepalive().orElseThrow());
        assertEquals(Duration.ofSeconds(60), d.keepalive(Duration.ofSeconds(60)).keepalive().orElseThrow());
        refused("keepalive", () -> d.keepalive(Duration.ofMillis(999)));
        refused("keepalive", () -> d.keepalive(Duration.ofMillis(60_001)));
        refused("keepalive", () -> d.keepalive(null));
        assertEquals("x".repeat(63), d.name("x".repeat(63)).name().orElseThrow());
        refused("name", () -> d.name("x".repeat(64)));
        refused("url", () -> d.url(URI.create("https://127.0.0.1:1")));
        refused("url", () -> d.url(URI.create("http://127.0.0.1:1/v1")));
        refused("url", () -> d.url(URI.create("unix:/x")));
        refused("socket", () -> d.socket(null));
        SessionOptions url = d.socket(Path.of("/s")).url(URI.create("http://127.0.0.1:8080"));
        assertTrue(url.socket().isEmpty(), "the last one given wins");
        assertEquals("http://127.0.0.1:8080", Address.resolve(url).toString());
        assertEquals("unix:/s", Address.resolve(url.socket(Path.of("/s"))).toString());
        assertEquals(80, Address.ofUrl(URI.create("http://localhost")).port());
    }

    @Test
    void requestBodiesCarryTheOptions() {
        assertEquals(Map.of("keepaliveMs", 2500L, "name", "app"),
                Api.sessionBody(SessionOptions.defaults().keepalive(Duration.ofMillis(2500)).name("app")));
        assertEquals(Map.of(), Api.sessionBody(SessionOptions.defaults()));
        assertEquals(Map.of("name", "b", "namespace", "n", "durationSeconds", 5, "holderIdentity", "h", "waitMs", 10),
                Api.acquireBody("b", AcquireOptions.defaults().namespace("n").durationSeconds(5).holderIdentity("h"), 10));
        assertEquals(Map.of("name", "b", "waitMs", 0, "slot", 3),
                Api.acquireBody("b", AcquireOptions.defaults().slot(3), 0));
    }

    @Test
    void waitsAndIntervals() {
        assertEquals(Api.MAX_WAIT_MS, Api.waitMsFor(-1));
        assertEquals(Api.MAX_WAIT_MS, Api.waitMsFor(60_000_000_000L));
        assertEquals(250, Api.waitMsFor(250_000_000L));
        assertEquals(0, Api.waitMsFor(0));
        assertEquals(5000L * 1_000_000 / 3, Api.refreshIntervalNanos(5000, List.of()));
        assertEquals(500_000_000L, Api.refreshIntervalNanos(5000, List.of(3, 15)));
    }

    @Test
    void lostReasonsHaveTheirWireNames() {
        for (LostReason r : LostReason.values()) {
            assertEquals(r, LostReason.fromWire(r.wireName()));
        }
        assertEquals("LocalDeadline", LostReason.LOCAL_DEADLINE.wireName());
        assertThrows(IllegalArgumentException.class, () -> LostReason.fromWire("Nope"));
        assertEquals(LostReason.REVOKED, LostReason.fromWireOrRevoked("SomethingNew"));
    }

    @Test
    void anAgentThatIsNotThereIsUnreachable() {
        AgentUnreachableException e = assertThrows(AgentUnreachableException.class,
                () -> Session.open(SessionOptions.defaults().socket(Path.of("target/no-such-agent.sock"))));
        assertEquals("agent_unreachable", e.code());
        assertTrue(e.status().isEmpty());
        // A loopback port nobody listens on: port 1 is privileged and unused here.
        assertThrows(AgentUnreachableException.class,
                () -> Session.open(SessionOptions.defaults().url(URI.create("http://127.0.0.1:1"))));
    }
}
