package palisadekube

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/rest"
)

// A refusal as the chart's policy words it.
const staleRefusal = `leases.palisade.dev "op" is forbidden: ValidatingAdmissionPolicy 'palisade-operator-ops-op' with binding 'palisade-operator-ops-op' denied request: CREATE leases ops/op refused: stale fencing token 41 of system:serviceaccount:ops:op is lower than the current token 42 of Lease ops/op (a newer leader holds it)`

func statusBody(code int, reason, message string) []byte {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Status", "status": "Failure",
		"code": code, "reason": reason, "message": message,
	})
	return b
}

func TestAnswersAreClassifiedByCodeAndMessage(t *testing.T) {
	cases := []struct {
		name   string
		status int
		body   []byte
		want   answerKind
		words  string
	}{
		{"stale token refused", 403, statusBody(403, "Forbidden", staleRefusal), answerRefuses, "stale fencing token 41"},
		{"still accepted", 409, statusBody(409, "AlreadyExists", `leases.palisade.dev "op" already exists`), answerStillAccepts, "already exists"},
		{"lease missing", 201, []byte(`{"apiVersion":"palisade.dev/v1alpha1","kind":"Lease"}`), answerLeaseMissing, "does not exist"},
		{"not allowed to impersonate", 403, statusBody(403, "Forbidden", `users "system:serviceaccount:ops:op" is forbidden: User "system:serviceaccount:ops:op" cannot impersonate resource "userextras/palisade.dev/fencing-token"`), answerOther, "cannot impersonate"},
		{"no token granted yet, as this server sees it", 403, statusBody(403, "Forbidden", "CREATE leases ops/op refused: fencing token 41 of system:serviceaccount:ops:op, but Lease ops/op has granted no token yet"), answerOther, "granted no token yet"},
		{"a stale marker outside a 403", 422, statusBody(422, "Invalid", "stale fencing token"), answerOther, "422 Unprocessable Entity"},
		{"server error, not JSON", 502, []byte("bad gateway\n"), answerOther, "502 Bad Gateway: bad gateway"},
		{"no body", 503, nil, answerOther, "(no body)"},
		{"ok is not created", 200, []byte(`{}`), answerOther, "200 OK"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := classify(c.status, c.body)
			if got.kind != c.want || !strings.Contains(got.text, c.words) {
				t.Errorf("classify(%d) = %+v, want kind %d with %q", c.status, got, c.want, c.words)
			}
		})
	}
	long := classify(500, []byte(strings.Repeat("x", 1000)))
	if len(long.text) > 400 {
		t.Errorf("a long body is not shortened: %d bytes", len(long.text))
	}
}

func ptr[T any](v T) *T { return &v }

func TestServersAreTheReadyHTTPSEndpoints(t *testing.T) {
	slices := []discoveryv1.EndpointSlice{
		{
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr("metrics"), Port: ptr(int32(9000))},
				{Name: ptr("https"), Port: ptr(int32(6443))},
			},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
				{Addresses: []string{"10.0.0.1"}}, // readiness unknown: ready
				{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false), Terminating: ptr(true)}},
			},
		},
		{
			AddressType: discoveryv1.AddressTypeIPv6,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(443))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"fd00::1"}}},
		},
		{
			// The same server twice (a slice being replaced): asked once.
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(6443))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
		},
		{
			// No port named https: nothing to ask.
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.9"}}},
		},
	}
	got := endpointSliceServers(slices...)
	want := []string{"https://10.0.0.1:6443", "https://10.0.0.2:6443", "https://[fd00::1]:443"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("servers %q, want %q", got, want)
	}
	if got := endpointSliceServers(); len(got) != 0 {
		t.Errorf("no slices: %q", got)
	}
}

// The confirm step's client verifies each server's certificate against the name the
// config uses, so a server asked at another address (its own, from an EndpointSlice)
// needs no certificate for it. A TLS server of the test certificate (valid for
// 127.0.0.1, ::1 and example.com, not localhost) shows it: the real API server's
// certificate holds every address it can be reached at on the local plane.
func TestConfirmVerifiesServersAgainstTheConfigsName(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	cfg := &rest.Config{
		Host:            srv.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})},
	}
	byName := "https://localhost:" + srv.URL[strings.LastIndex(srv.URL, ":")+1:] + "/"
	plain, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Get(byName); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("the test certificate should not hold localhost: %v", err)
	}
	probe, err := newProbeClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := probe.Get(byName)
	if err != nil {
		t.Fatalf("the probe client did not verify localhost against 127.0.0.1: %v", err)
	}
	resp.Body.Close()

	// A server name the config sets is kept, and verified.
	cfg.TLSClientConfig.ServerName = "wrong.example.org"
	probe, err = newProbeClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.Get(byName); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a wrong server name passed verification: %v", err)
	}
}

// A token <= 0 is none: Lead sets it and asks nothing (the fence has no client to ask
// with: asking would panic).
func TestLeadWithoutATokenAsksNothing(t *testing.T) {
	f := &Fence{cfg: &rest.Config{Host: "https://127.0.0.1:1"}, namespace: "ops", lease: "op", username: testUser,
		servers: []string{"https://127.0.0.1:1"}, timeout: time.Second}
	f.setToken(7)
	for _, token := range []int64{0, -3} {
		if err := f.Lead(context.Background(), token); err != nil {
			t.Errorf("Lead(%d): %v", token, err)
		}
		if f.Token() != 0 {
			t.Errorf("Lead(%d): Token() = %d, want 0", token, f.Token())
		}
	}
}
