package dev.palisade;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class JsonTest {
    @Test
    void parsesTheAgentsGrant() {
        Object doc = Json.parse("{\"name\":\"billing\",\"namespace\":\"ns\",\"state\":\"held\",\"token\":9007199254740993,"
                + "\"validForMs\":9876,\"lostReason\":null,\"claim\":\"billing-x\",\"durationSeconds\":15}");
        Map<?, ?> map = (Map<?, ?>) doc;
        assertEquals("billing", map.get("name"));
        assertEquals(9007199254740993L, map.get("token")); // beyond a double's exact integers
        assertEquals(9876L, map.get("validForMs"));
        assertTrue(map.containsKey("lostReason"));
        assertNull(map.get("lostReason"));
        Api.GrantInfo g = Api.parseGrant(doc);
        assertEquals(9007199254740993L, g.token());
        assertEquals(15, g.durationSeconds());
        assertNull(g.lostReason());
        assertNull(g.slot(), "an agent from before semaphores names no slot");
        Api.GrantInfo slot = Api.parseGrant(Json.parse(
                "{\"name\":\"w\",\"namespace\":\"ns\",\"state\":\"held\",\"token\":4,\"slot\":2,\"fenceKey\":\"ns/w#2\"}"));
        assertEquals(2, slot.slot());
        assertEquals("ns/w#2", slot.fenceKey());
    }

    @Test
    void parsesEveryKindOfValue() {
        Object doc = Json.parse(" [ true , false , null , -0 , 1.5e3 , -2E-2 , \"a\\\"b\\\\c\\/\\n\\u00e9\\ud83d\\ude00\" , { } , [ ] ] ");
        assertEquals(Arrays.asList(true, false, null, 0L, 1500.0, -0.02, "a\"b\\c/\n\u00e9\ud83d\ude00", Map.of(), List.of()),
                doc);
    }

    @Test
    void refusesWhatIsNotJson() {
        for (String bad : List.of("", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "tru", "\"a", "\"\\x\"", "{} {}",
                "\"\u0001\"", "{1:2}", "[1 2]", "\"\\u12\"")) {
            assertThrows(IllegalArgumentException.class, () -> Json.parse(bad), bad);
        }
    }

    @Test
    void refusesDeepNesting() {
        String deep = "[".repeat(1000) + "]".repeat(1000);
        assertThrows(IllegalArgumentException.class, () -> Json.parse(deep));
    }

    @Test
    void writesCompactJsonThatReadsBack() {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("name", "b\"\\\n\u0001é");
        body.put("waitMs", 10_000);
        body.put("big", Long.MAX_VALUE);
        body.put("list", List.of(true, 1.5));
        body.put("none", null);
        String text = Json.write(body);
        assertEquals("{\"name\":\"b\\\"\\\\\\n\\u0001é\",\"waitMs\":10000,\"big\":9223372036854775807,"
                + "\"list\":[true,1.5],\"none\":null}", text);
        Map<?, ?> back = (Map<?, ?>) Json.parse(text);
        assertEquals(body.get("name"), back.get("name"));
        assertEquals(Long.MAX_VALUE, back.get("big"));
    }

    @Test
    void aGrantWithAWrongTypeIsRefused() {
        assertThrows(IllegalArgumentException.class,
                () -> Api.parseGrant(Json.parse("{\"name\":\"a\",\"namespace\":\"b\",\"state\":\"held\",\"token\":\"7\"}")));
        assertThrows(IllegalArgumentException.class, () -> Api.parseGrant(Json.parse("{\"name\":\"a\",\"state\":\"held\"}")));
        AgentException e = assertThrows(AgentException.class, () -> Api.grantFromAnswer(200, "nope".getBytes()));
        assertEquals("unexpected_response", e.code());
    }

    @Test
    void errorAnswersBecomeAgentExceptions() {
        AgentException e = Api.errorFromResponse(400,
                "{\"error\":\"invalid_field\",\"field\":\"name\",\"message\":\"a DNS label\"}".getBytes());
        assertEquals(400, e.status().getAsInt());
        assertEquals("invalid_field", e.code());
        assertEquals("name", e.field().orElseThrow());
        assertEquals("a DNS label", e.detail());
        AgentException text = Api.errorFromResponse(502, "bad gateway".getBytes());
        assertEquals("unexpected_response", text.code());
        assertEquals("bad gateway", text.detail());
        assertTrue(text.field().isEmpty());
    }

    @Test
    void theVerdictOnReports() {
        Api.GrantInfo lost = new Api.GrantInfo("a", "n", "lost", 5L, 0, "Expired", "m", null, null, null, null, null, null);
        assertEquals(LostReason.EXPIRED, Api.judge(5, lost).reason());
        assertTrue(!Api.judge(6, lost).lost(), "an earlier grant's loss says nothing of this one");
        Api.GrantInfo later = new Api.GrantInfo("a", "n", "held", 7L, 100, null, null, null, null, null, null, null, null);
        assertEquals(LostReason.SUPERSEDED, Api.judge(5, later).reason());
        Api.GrantInfo waiting = new Api.GrantInfo("a", "n", "waiting", null, 0, null, null, null, null, null, null, null, null);
        assertTrue(!Api.judge(5, waiting).lost());
        Api.GrantInfo released = new Api.GrantInfo("a", "n", "released", 5L, 0, null, null, null, null, null, null, null, null);
        assertEquals(LostReason.SESSION_ENDED, Api.judge(5, released).reason());
    }
}
