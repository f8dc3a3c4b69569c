package dev.palisade;

import java.nio.charset.StandardCharsets;

/** One operation of src/agent/openapi.yaml that the client calls; the tests check each is there. */
enum Endpoint {
    CREATE_SESSION("POST", "/v1/sessions"),
    GET_SESSION("GET", "/v1/sessions/{session}"),
    END_SESSION("DELETE", "/v1/sessions/{session}"),
    EVENTS("GET", "/v1/sessions/{session}/events"),
    ACQUIRE("POST", "/v1/sessions/{session}/leases"),
    GET_GRANT("GET", "/v1/sessions/{session}/leases/{namespace}/{name}"),
    RELEASE("DELETE", "/v1/sessions/{session}/leases/{namespace}/{name}");

    final String method;
    final String template;

    Endpoint(String method, String template) {
        this.method = method;
        this.template = template;
    }

    /** The request target: the template's parameters, in order, percent-encoded. */
    String target(String... params) {
        long wanted = template.chars().filter(c -> c == '{').count();
        if (params.length != wanted) {
            throw new IllegalArgumentException(template + " takes " + wanted + " parameters, not " + params.length);
        }
        StringBuilder out = new StringBuilder();
        int i = 0;
        int p = 0;
        while (i < template.length()) {
            int open = template.indexOf('{', i);
            if (open < 0) {
                out.append(template, i, template.length());
                break;
            }
            out.append(template, i, open);
            out.append(encode(params[p++]));
            i = template.indexOf('}', open) + 1;
        }
        return out.toString();
    }

    /** A path segment or query value: every byte but the unreserved ones percent-encoded. */
    static String encode(String s) {
        StringBuilder out = new StringBuilder();
        for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
            char c = (char) (b & 0xff);
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                    || c == '-' || c == '.' || c == '_' || c == '~') {
                out.append(c);
            } else {
                out.append('%').append(Character.toUpperCase(Character.forDigit((c >> 4) & 0xf, 16)))
                        .append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
            }
        }
        return out.toString();
    }
}
