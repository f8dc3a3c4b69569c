package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.yaml.snakeyaml.Yaml;

/**
 * The client against the agent's contract, src/agent/openapi.yaml: every operation it
 * calls, every field it sends or reads and every code it acts on must be there, so a
 * change of the spec fails here (no agent needed).
 */
class OpenApiTest {
    private static Map<String, Object> spec;

    @BeforeAll
    static void load() throws IOException {
        spec = new Yaml().load(Files.readString(Repo.root().resolve("src/agent/openapi.yaml")));
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> map(Object o, String what) {
        assertTrue(o instanceof Map, what + " is not a mapping in the spec");
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    private static List<Object> list(Object o, String what) {
        assertTrue(o instanceof List, what + " is not a list in the spec");
        return (List<Object>) o;
    }

    private static Map<String, Object> schema(String name) {
        return map(map(map(spec.get("components"), "components").get("schemas"), "schemas").get(name), name);
    }

    private static Map<String, Object> properties(String schemaName) {
        return map(schema(schemaName).get("properties"), schemaName + ".properties");
    }

    private static Map<String, Object> operation(Endpoint e) {
        Map<String, Object> item = map(map(spec.get("paths"), "paths").get(e.template), e.template);
        return map(item.get(e.method.toLowerCase()), e.method + " " + e.template);
    }

    @Test
    void everyOperationTheClientCallsIsInTheSpec() {
        for (Endpoint e : Endpoint.values()) {
            assertNotNull(operation(e), e.method + " " + e.template);
        }
    }

    @Test
    void pathParametersAreTheSpecs() {
        Map<String, Object> params = map(map(spec.get("components"), "components").get("parameters"), "parameters");
        for (Endpoint e : Endpoint.values()) {
            Map<String, Object> item = map(map(spec.get("paths"), "paths").get(e.template), e.template);
            List<Object> all = new ArrayList<>();
            if (item.get("parameters") != null) {
                all.addAll(list(item.get("parameters"), "parameters"));
            }
            if (operation(e).get("parameters") != null) {
                all.addAll(list(operation(e).get("parameters"), "parameters"));
            }
            Set<String> declared = new HashSet<>();
            for (Object p : all) {
                Map<String, Object> param = map(p, "parameter");
                if (param.get("$ref") instanceof String ref) {
                    param = map(params.get(ref.substring(ref.lastIndexOf('/') + 1)), ref);
                }
                if ("path".equals(param.get("in"))) {
                    declared.add((String) param.get("name"));
                }
            }
            Set<String> used = new HashSet<>();
            Matcher m = Pattern.compile("\\{(\\w+)}").matcher(e.template);
            while (m.find()) {
                used.add(m.group(1));
            }
            assertEquals(used, declared, e.template);
        }
    }

    @Test
    void theStatusesTheClientExpectsAreTheSpecs() {
        Map<Endpoint, Set<String>> expected = new EnumMap<>(Endpoint.class);
        expected.put(Endpoint.CREATE_SESSION, Set.of("201"));
        expected.put(Endpoint.GET_SESSION, Set.of("200", "404"));
        expected.put(Endpoint.END_SESSION, Set.of("204", "404"));
        expected.put(Endpoint.EVENTS, Set.of("200"));
        expected.put(Endpoint.ACQUIRE, Set.of("200", "202"));
        expected.put(Endpoint.GET_GRANT, Set.of("200", "404"));
        expected.put(Endpoint.RELEASE, Set.of("200", "404", "409"));
        assertEquals(Set.of(Endpoint.values()), expected.keySet());
        for (Map.Entry<Endpoint, Set<String>> x : expected.entrySet()) {
            Set<String> responses = map(operation(x.getKey()).get("responses"), "responses").keySet();
            assertTrue(responses.containsAll(x.getValue()), x.getKey() + ": " + x.getValue() + " not all in " + responses);
        }
        Map<String, Object> ok = map(map(operation(Endpoint.EVENTS).get("responses"), "responses").get("200"), "200");
        assertTrue(map(ok.get("content"), "content").containsKey("text/event-stream"));
    }

    @Test
    void theWaitQueryParameter() {
        Map<String, Object> wait = null;
        for (Object p : list(operation(Endpoint.GET_GRANT).get("parameters"), "parameters")) {
            if ("waitMs".equals(map(p, "parameter").get("name"))) {
                wait = map(p, "waitMs");
            }
        }
        assertNotNull(wait, "GET grant has no waitMs");
        assertEquals("query", wait.get("in"));
        int max = (Integer) map(wait.get("schema"), "schema").get("maximum");
        assertTrue(Api.MAX_WAIT_MS <= max, "the client waits at most " + Api.MAX_WAIT_MS + " ms, the spec " + max);
        assertTrue(Api.ANSWER_MARGIN_NANOS / 1_000_000 > 11_000, "the spec answers within waitMs + 11 s");
    }

    @Test
    void requestBodiesSendOnlyTheSpecsFields() {
        Map<String, Object> acquire = properties("AcquireRequest");
        Map<String, Object> body = Api.acquireBody("b",
                AcquireOptions.defaults().namespace("ns").durationSeconds(15).holderIdentity("pod").slot(2), 0);
        assertTrue(acquire.keySet().containsAll(body.keySet()), body.keySet() + " vs " + acquire.keySet());
        assertTrue(body.keySet().containsAll(list(schema("AcquireRequest").get("required"), "required")));
        Map<String, Object> duration = map(acquire.get("durationSeconds"), "durationSeconds");
        assertEquals(List.of(1, 86_400), List.of(duration.get("minimum"), duration.get("maximum")));
        assertEquals(253, map(acquire.get("holderIdentity"), "holderIdentity").get("maxLength"));
        Map<String, Object> slot = map(acquire.get("slot"), "slot");
        assertEquals(List.of(0, AcquireOptions.MAX_SLOT), List.of(slot.get("minimum"), slot.get("maximum")));
        assertTrue(Api.MAX_WAIT_MS <= (Integer) map(acquire.get("waitMs"), "waitMs").get("maximum"));
        Map<String, Object> session = properties("SessionRequest");
        Map<String, Object> sbody = Api.sessionBody(
                SessionOptions.defaults().keepalive(java.time.Duration.ofSeconds(5)).name("worker"));
        assertTrue(session.keySet().containsAll(sbody.keySet()), sbody.keySet() + " vs " + session.keySet());
        Map<String, Object> keepalive = map(session.get("keepaliveMs"), "keepaliveMs");
        assertEquals(List.of(1000, 60_000), List.of(keepalive.get("minimum"), keepalive.get("maximum")));
        assertEquals(63, map(session.get("name"), "name").get("maxLength"));
    }

    @Test
    void theDocumentsTheClientReads() {
        Map<String, Object> grant = properties("Grant");
        Set<String> read = Set.of("name", "namespace", "state", "token", "validForMs", "lostReason", "lostMessage",
                "claim", "claimUid", "holderIdentity", "durationSeconds", "slot", "fenceKey");
        assertTrue(grant.keySet().containsAll(read), read + " vs " + grant.keySet());
        assertEquals(Set.of(Api.WAITING, Api.HELD, Api.LOST, Api.RELEASED),
                new HashSet<>(list(map(grant.get("state"), "state").get("enum"), "enum")));
        assertTrue(list(schema("Session").get("required"), "required").containsAll(List.of("id", "keepaliveMs", "grants")));
        assertTrue(properties("Session").containsKey("namespace"));
    }

    @Test
    void theErrorCodesTheClientActsOn() {
        Set<Object> codes = new HashSet<>(list(map(properties("Error").get("error"), "error").get("enum"), "enum"));
        assertTrue(codes.containsAll(Set.of("unknown_session", "grant_lost", "already_acquired", "invalid_field")), codes.toString());
        assertTrue(list(schema("Error").get("required"), "required").containsAll(List.of("error", "message")));
        assertTrue(properties("Error").containsKey("field"));
        assertTrue(!codes.contains("agent_unreachable") && !codes.contains("unexpected_response"),
                "the client's own codes must not collide with the agent's");
    }

    @Test
    void theLossReasons() {
        Set<String> agent = new HashSet<>();
        for (Object r : list(map(properties("Grant").get("lostReason"), "lostReason").get("enum"), "enum")) {
            agent.add((String) r);
        }
        Set<String> ours = new HashSet<>();
        for (LostReason r : LostReason.values()) {
            ours.add(r.wireName());
        }
        assertTrue(ours.containsAll(agent), "LostReason lacks " + agent);
        for (LostReason own : List.of(LostReason.SESSION_ENDED, LostReason.KEEPALIVE_MISSED, LostReason.RELEASED)) {
            assertTrue(!agent.contains(own.wireName()), own + " must not collide with the agent's reasons");
        }
    }

    @Test
    void theRefreshIsAKeepalive() {
        // The client refreshes its deadlines with GET of the session instead of a keepalive.
        assertTrue(((String) operation(Endpoint.GET_SESSION).get("summary")).contains("keepalive"));
    }
}
