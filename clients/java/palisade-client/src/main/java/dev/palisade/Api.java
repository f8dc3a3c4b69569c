package dev.palisade;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The agent's documents and rules, without I/O: request bodies, Grant and Session answers, errors. */
final class Api {
    private Api() {}

    /** The agent's bound on waitMs is 30 s; the client asks for 10 s at most per request, and loops. */
    static final int MAX_WAIT_MS = 10_000;
    /** The agent answers within waitMs + 11 s (its API server calls, retried once); then, never. */
    static final long ANSWER_MARGIN_NANOS = 12_000_000_000L;

    static final String WAITING = "waiting";
    static final String HELD = "held";
    static final String LOST = "lost";
    static final String RELEASED = "released";

    /** The agent's Grant document. */
    record GrantInfo(String name, String namespace, String state, Long token, long validForMs, String lostReason,
            String lostMessage, String claim, String claimUid, String holderIdentity, Integer durationSeconds,
            Integer slot, String fenceKey) {
        String key() {
            return key(namespace, name);
        }

        static String key(String namespace, String name) {
            return namespace + "/" + name;
        }
    }

    /** The agent's Session document (the part the client reads). */
    record SessionInfo(String id, String namespace, long keepaliveMs, List<GrantInfo> grants) {}

    static Map<String, Object> sessionBody(SessionOptions options) {
        Map<String, Object> body = new LinkedHashMap<>();
        options.keepalive().ifPresent(d -> body.put("keepaliveMs", d.toMillis()));
        options.name().ifPresent(n -> body.put("name", n));
        return body;
    }

    static Map<String, Object> acquireBody(String name, AcquireOptions options, int waitMs) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("name", name);
        options.namespace().ifPresent(ns -> body.put("namespace", ns));
        options.durationSeconds().ifPresent(d -> body.put("durationSeconds", d));
        options.holderIdentity().ifPresent(h -> body.put("holderIdentity", h));
        body.put("waitMs", waitMs);
        options.slot().ifPresent(s -> body.put("slot", s));
        return body;
    }

    /** The waitMs of the next acquire or resume, {@code remainingNanos} before the caller's timeout (negative: none). */
    static int waitMsFor(long remainingNanos) {
        if (remainingNanos < 0) {
            return MAX_WAIT_MS;
        }
        return (int) Math.max(0, Math.min(MAX_WAIT_MS, remainingNanos / 1_000_000));
    }

    /**
     * Nanoseconds between two GETs of the session: a third of the keepalive, and a sixth
     * of the shortest Lease duration held, so that a healthy agent's answers (validForMs at
     * least a third of a duration) always come before the last one runs out.
     */
    static long refreshIntervalNanos(long keepaliveMs, List<Integer> durationsSeconds) {
        long interval = keepaliveMs * 1_000_000L / 3;
        for (Integer d : durationsSeconds) {
            interval = Math.min(interval, d * 1_000_000_000L / 6);
        }
        return interval;
    }

    static Object parseJson(int status, byte[] body) {
        try {
            return Json.parse(new String(body, StandardCharsets.UTF_8));
        } catch (IllegalArgumentException e) {
            throw new AgentException(status, "unexpected_response", null, e.getMessage());
        }
    }

    /** The Grant in {@code doc}; IllegalArgumentException when it is not one. */
    static GrantInfo parseGrant(Object doc) {
        if (!(doc instanceof Map<?, ?> map)) {
            throw new IllegalArgumentException("a Grant is a JSON object, not " + doc);
        }
        for (String key : List.of("name", "namespace", "state")) {
            if (!(map.get(key) instanceof String)) {
                throw new IllegalArgumentException("Grant." + key + " is missing or not a string: " + doc);
            }
        }
        Long validFor = opt(map, "validForMs", Long.class);
        Long duration = opt(map, "durationSeconds", Long.class);
        Long slot = opt(map, "slot", Long.class);
        return new GrantInfo((String) map.get("name"), (String) map.get("namespace"), (String) map.get("state"),
                opt(map, "token", Long.class), validFor == null ? 0 : validFor,
                opt(map, "lostReason", String.class), opt(map, "lostMessage", String.class),
                opt(map, "claim", String.class), opt(map, "claimUid", String.class),
                opt(map, "holderIdentity", String.class),
                duration == null ? null : (int) Math.min(Integer.MAX_VALUE, duration),
                slot == null ? null : (int) Math.min(Integer.MAX_VALUE, slot), opt(map, "fenceKey", String.class));
    }

    private static <T> T opt(Map<?, ?> map, String key, Class<T> kind) {
        Object value = map.get(key);
        if (value == null) {
            return null;
        }
        if (!kind.isInstance(value)) {
            throw new IllegalArgumentException("Grant." + key + " is not a " + kind.getSimpleName() + ": " + value);
        }
        return kind.cast(value);
    }

    static GrantInfo grantFromAnswer(int status, byte[] body) {
        try {
            return parseGrant(parseJson(status, body));
        } catch (IllegalArgumentException e) {
            throw new AgentException(status, "unexpected_response", null, e.getMessage());
        }
    }

    static SessionInfo sessionFromAnswer(int status, byte[] body) {
        Object doc = parseJson(status, body);
        try {
            if (!(doc instanceof Map<?, ?> map) || !(map.get("id") instanceof String id)
                    || !(map.get("keepaliveMs") instanceof Long keepalive) || !(map.get("grants") instanceof List<?> list)) {
                throw new IllegalArgumentException("not a Session: " + doc);
            }
            String ns = map.get("namespace") instanceof String s ? s : "";
            List<GrantInfo> grants = new ArrayList<>();
            for (Object g : list) {
                grants.add(parseGrant(g));
            }
            return new SessionInfo(id, ns, keepalive, grants);
        } catch (IllegalArgumentException e) {
            throw new AgentException(status, "unexpected_response", null, e.getMessage());
        }
    }

    /**
     * The grants an SSE event reports: every grant of an {@code event: session}, the one of
     * an {@code event: grant}; other events report none. IllegalArgumentException when unreadable.
     */
    static List<GrantInfo> grantsOfEvent(String event, String data) {
        if (event.equals("grant")) {
            return List.of(parseGrant(Json.parse(data)));
        }
        if (!event.equals("session")) {
            return List.of();
        }
        Object doc = Json.parse(data);
        if (!(doc instanceof Map<?, ?> map) || !(map.get("grants") instanceof List<?> list)) {
            throw new IllegalArgumentException("a Session event without grants: " + data);
        }
        List<GrantInfo> out = new ArrayList<>();
        for (Object g : list) {
            out.add(parseGrant(g));
        }
        return out;
    }

    /** The AgentException for a 4xx/5xx answer: the agent's JSON Error, or its text. */
    static AgentException errorFromResponse(int status, byte[] body) {
        Object doc;
        try {
            doc = Json.parse(new String(body, StandardCharsets.UTF_8));
        } catch (IllegalArgumentException e) {
            doc = null;
        }
        if (doc instanceof Map<?, ?> map && map.get("error") instanceof String code) {
            return new AgentException(status, code, map.get("field") instanceof String f ? f : null,
                    map.get("message") instanceof String m ? m : "");
        }
        String text = new String(body, StandardCharsets.UTF_8).strip();
        if (text.length() > 500) {
            text = text.substring(0, 500);
        }
        return new AgentException(status, "unexpected_response", null,
                text.isEmpty() ? "HTTP " + status + " with no error body" : text);
    }

    /** What a reported state means for a grant held with {@code heldToken}. */
    record Verdict(boolean lost, LostReason reason, String message) {
        static final Verdict NOTHING = new Verdict(false, null, null);
    }

    /**
     * A report without a token is about a claim never granted; one about a lower token is
     * about an earlier grant (says nothing), a higher one about a later grant (this one
     * ended). {@code released} that this process did not ask for is a loss to it.
     */
    static Verdict judge(long heldToken, GrantInfo info) {
        if (info.token() == null || info.token() < heldToken) {
            return Verdict.NOTHING;
        }
        if (info.state().equals(LOST)) {
            return new Verdict(true, LostReason.fromWireOrRevoked(info.lostReason()), info.lostMessage());
        }
        if (info.state().equals(RELEASED)) {
            return new Verdict(true, LostReason.SESSION_ENDED, "the agent released the grant");
        }
        if (info.token() > heldToken) {
            return new Verdict(true, LostReason.SUPERSEDED, "the agent reports token " + info.token() + " now");
        }
        return Verdict.NOTHING;
    }
}
