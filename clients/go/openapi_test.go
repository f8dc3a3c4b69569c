package palisade

import (
	"bufio"
	"os"
	"reflect"
	"strings"
	"testing"
)

// yamlKeys reads the key paths of a YAML document, line by line (the standard
// library has no YAML parser; the OpenAPI document is block style): "a/b/c" for each
// mapping key, "a/b/x" for a list item "- x" or "- name: x", and "a/enum/x" for each
// value of a flow list "enum: [x, y]".
func yamlKeys(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("the agent's OpenAPI document: %v", err)
	}
	defer f.Close()
	keys := map[string]bool{}
	type level struct {
		indent int
		key    string
	}
	var stack []level
	inBlock := -1 // indent of a `|` block scalar being skipped
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		indent := len(line) - len(trimmed)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if inBlock >= 0 {
			if indent > inBlock {
				continue
			}
			inBlock = -1
		}
		item := strings.HasPrefix(trimmed, "- ")
		if item {
			trimmed = strings.TrimPrefix(trimmed, "- ")
			indent += 2
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		parent := ""
		for _, l := range stack {
			parent += l.key + "/"
		}
		key, value, isMap := strings.Cut(trimmed, ":")
		if !isMap || strings.HasPrefix(key, `"$ref"`) || strings.HasPrefix(key, "$ref") {
			if item {
				keys[parent+strings.Trim(trimmed, `"`)] = true
			}
			continue
		}
		key = strings.Trim(key, `"`)
		value = strings.TrimSpace(value)
		if item && key == "name" {
			keys[parent+value] = true
			continue
		}
		if item {
			continue
		}
		keys[parent+key] = true
		switch {
		case value == "|" || value == ">-" || value == ">":
			inBlock = indent
		case strings.HasPrefix(value, "[") && strings.HasSuffix(value, "]"):
			for _, v := range strings.Split(strings.Trim(value, "[]"), ",") {
				keys[parent+key+"/"+strings.TrimSpace(v)] = true
			}
		case value == "":
			stack = append(stack, level{indent, key})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

const openAPIFile = "../../src/agent/openapi.yaml"

// Drift between the client and the agent's contract fails here.
func TestUnitClientMatchesTheOpenAPIDocument(t *testing.T) {
	keys := yamlKeys(t, openAPIFile)
	need := func(what, key string) {
		t.Helper()
		if !keys[key] {
			t.Errorf("%s: %q is not in %s", what, key, openAPIFile)
		}
	}
	for _, c := range apiCalls {
		need(c.method+" "+c.path, "paths/"+c.path+"/"+strings.ToLower(c.method))
	}
	need("the long poll's query parameter", "paths/"+pathLease+"/get/parameters/"+queryWaitMs)
	schemas := map[string]any{
		"SessionRequest": sessionRequest{},
		"Session":        sessionJSON{},
		"AcquireRequest": acquireRequest{},
		"Grant":          grantJSON{},
		"ObjectWritten":  ObjectWritten{},
		"StaleToken":     staleJSON{},
	}
	for schema, v := range schemas {
		typ := reflect.TypeOf(v)
		for i := 0; i < typ.NumField(); i++ {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			need(typ.Name()+"."+typ.Field(i).Name, "components/schemas/"+schema+"/properties/"+name)
		}
	}
	for _, st := range grantStates {
		need("grant state", "components/schemas/Grant/properties/state/enum/"+st)
	}
	for _, r := range agentReasons {
		need("lost reason", "components/schemas/Grant/properties/lostReason/enum/"+string(r))
	}
	for _, code := range []string{CodeUnknownSession, CodeUnknownGrant, CodeAlreadyAcquired, CodeGrantLost, CodeInvalidField} {
		need("error code", "components/schemas/Error/properties/error/enum/"+code)
	}
	for _, f := range []string{"error", "field", "message"} {
		need("error field", "components/schemas/Error/properties/"+f)
	}
}

// The check itself must see what is there and miss what is not.
func TestUnitYAMLKeys(t *testing.T) {
	keys := yamlKeys(t, openAPIFile)
	for _, k := range []string{
		"paths//v1/sessions/post",
		"paths//v1/sessions/{session}/leases/{namespace}/{name}/delete",
		"components/schemas/Error/properties/error/enum/grant_lost",
		"components/schemas/Grant/properties/state/enum/held",
		"components/schemas/Grant/properties/validForMs",
	} {
		if !keys[k] {
			t.Errorf("missing %q", k)
		}
	}
	for _, k := range []string{
		"paths//v1/sessions/get",
		"components/schemas/Grant/properties/bogus",
		"paths//v1/sessions/{session}/events/get/description/First an `event",
	} {
		if keys[k] {
			t.Errorf("found %q, which is not in the document", k)
		}
	}
}
