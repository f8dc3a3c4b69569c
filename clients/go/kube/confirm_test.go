package palisadekube

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// fakeAPIServer is an API server over TLS with the test certificate (valid for
// 127.0.0.1, ::1 and example.com, not localhost) that answers a SelfSubjectReview,
// the kubernetes Service's EndpointSlices and the confirm step's dry-run creates.
type fakeAPIServer struct {
	srv      *httptest.Server
	username string
	// answer answers the n-th (from 1) dry-run create sent to host (host:port).
	answer func(host string, n int) (int, []byte)
	slices []discoveryv1.EndpointSlice
	forbid bool // refuse to list the EndpointSlices

	mu       sync.Mutex
	asked    map[string]int // dry-run creates by host
	probes   []*http.Request
	bodies   [][]byte
	reviews  []*http.Request
	selector string
	// requestBodies: the last body sent to each path.
	requestBodies map[string][]byte
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	t.Helper()
	f := &fakeAPIServer{username: testUser, asked: map[string]int{}, requestBodies: map[string][]byte{}}
	f.answer = func(string, int) (int, []byte) { return 403, statusBody(403, "Forbidden", staleRefusal) }
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requestBodies[r.URL.Path] = body
	reply := func(code int, b []byte) {
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		w.Write(b)
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/selfsubjectreviews":
		f.reviews = append(f.reviews, r)
		reply(201, []byte(fmt.Sprintf(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview","status":{"userInfo":{"username":%q,"groups":["system:serviceaccounts"]}}}`, f.username)))
	case r.Method == http.MethodGet && r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices":
		f.selector = r.URL.Query().Get("labelSelector")
		if f.forbid {
			reply(403, statusBody(403, "Forbidden", `endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:ops:op" cannot list resource "endpointslices"`))
			return
		}
		b, _ := json.Marshal(discoveryv1.EndpointSliceList{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSliceList"},
			Items:    f.slices,
		})
		reply(200, b)
	case r.Method == http.MethodPost && r.URL.Path == "/apis/palisade.dev/v1alpha1/namespaces/ops/leases":
		f.asked[r.Host]++
		f.probes = append(f.probes, r)
		f.bodies = append(f.bodies, body)
		code, b := f.answer(r.Host, f.asked[r.Host])
		reply(code, b)
	default:
		reply(404, statusBody(404, "NotFound", "no "+r.URL.Path))
	}
}

// config is a rest.Config for the fake server at 127.0.0.1, trusting its certificate.
func (f *fakeAPIServer) config() *rest.Config {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	return &rest.Config{
		Host:            f.srv.URL,
		BearerToken:     "secret",
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
	}
}

func (f *fakeAPIServer) port() string { return f.srv.URL[strings.LastIndex(f.srv.URL, ":")+1:] }

func (f *fakeAPIServer) askedOf(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[host]
}

func newTestFence(t *testing.T, api *fakeAPIServer, opts FenceOptions) *Fence {
	t.Helper()
	t.Setenv(ServersEnv, "")
	f, err := NewFence(context.Background(), api.config(), "ops", "op", opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestNewFenceLearnsTheUsernameUnstamped(t *testing.T) {
	api := newFakeAPIServer(t)
	f := newTestFence(t, api, FenceOptions{})
	if f.Username() != testUser {
		t.Errorf("Username() = %q, want %q", f.Username(), testUser)
	}
	if len(api.reviews) != 1 {
		t.Fatalf("%d SelfSubjectReviews, want 1", len(api.reviews))
	}
	r := api.reviews[0]
	if r.Header.Get("Impersonate-User") != "" || r.Header.Get(tokenHeader) != "" {
		t.Errorf("the SelfSubjectReview was stamped: %v", r.Header)
	}
	if r.Header.Get("Authorization") != "Bearer secret" {
		t.Errorf("the SelfSubjectReview did not authenticate as the config: %v", r.Header)
	}
	var sent map[string]any
	json.Unmarshal(api.requestBodies["/apis/authentication.k8s.io/v1/selfsubjectreviews"], &sent)
	if sent["apiVersion"] != "authentication.k8s.io/v1" || sent["kind"] != "SelfSubjectReview" {
		t.Errorf("the SelfSubjectReview sent: %v", sent)
	}
	if f.timeout != 30*time.Second {
		t.Errorf("default confirm timeout %v, want 30s", f.timeout)
	}
}

func TestNewFenceRefusesAUserThatIsNotAServiceAccount(t *testing.T) {
	api := newFakeAPIServer(t)
	api.username = "kubernetes-admin"
	t.Setenv(ServersEnv, "")
	_, err := NewFence(context.Background(), api.config(), "ops", "op", FenceOptions{})
	if err == nil || !strings.Contains(err.Error(), `"kubernetes-admin"`) || !strings.Contains(err.Error(), "service account") {
		t.Fatalf("error %v, want one naming kubernetes-admin as not a service account", err)
	}
}

func TestNewFenceChecksItsArgumentsFirst(t *testing.T) {
	api := newFakeAPIServer(t)
	t.Setenv(ServersEnv, "https://10.0.0.1:6443,10.0.0.2")
	_, err := NewFence(context.Background(), api.config(), "ops", "op", FenceOptions{})
	if err == nil || !strings.Contains(err.Error(), `PALISADE_APISERVERS: "10.0.0.2"`) {
		t.Fatalf("error %v, want one naming the bad entry of PALISADE_APISERVERS", err)
	}
	if len(api.reviews) != 0 {
		t.Error("a SelfSubjectReview was sent for bad arguments")
	}
}

func TestLeadConfirmsEveryServer(t *testing.T) {
	api := newFakeAPIServer(t)
	// Each server accepts the predecessor's token twice before refusing it.
	api.answer = func(host string, n int) (int, []byte) {
		if n <= 2 {
			return 409, statusBody(409, "AlreadyExists", `leases.palisade.dev "op" already exists`)
		}
		return 403, statusBody(403, "Forbidden", staleRefusal)
	}
	// Two servers: the fake at its IP and at "localhost", a name its certificate does
	// not hold. The config's name (127.0.0.1) verifies both.
	local := "localhost:" + api.port()
	ip := "127.0.0.1:" + api.port()
	f := newTestFence(t, api, FenceOptions{Servers: []string{"https://" + local, "https://" + ip}})

	start := time.Now()
	if err := f.Lead(context.Background(), 42); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Lead took %v for two retries a server", d)
	}
	if api.askedOf(local) != 3 || api.askedOf(ip) != 3 {
		t.Errorf("asked %v, want each server 3 times", api.asked)
	}
	if f.Token() != 42 {
		t.Errorf("Token() = %d, want 42", f.Token())
	}
	wantBody := `{"apiVersion":"palisade.dev/v1alpha1","kind":"Lease","metadata":{"name":"op","namespace":"ops"},"spec":{}}`
	for i, r := range api.probes {
		if q := r.URL.RawQuery; q != "dryRun=All" {
			t.Errorf("probe %d: query %q, want dryRun=All", i, q)
		}
		if r.Header.Get("Impersonate-User") != testUser || r.Header.Get(tokenHeader) != "41" {
			t.Errorf("probe %d: not stamped with the predecessor's token 41: %v", i, r.Header)
		}
		if r.Header.Get("Authorization") != "Bearer secret" {
			t.Errorf("probe %d: not authenticated as the config: %v", i, r.Header)
		}
		var got, want any
		json.Unmarshal(api.bodies[i], &got)
		json.Unmarshal([]byte(wantBody), &want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("probe %d: body %s, want %s", i, api.bodies[i], wantBody)
		}
	}
}

func TestConfirmVerifiesServersAgainstTheConfigsName(t *testing.T) {
	api := newFakeAPIServer(t)
	cfg := api.config()
	byName := "https://localhost:" + api.port() + "/healthz"
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

func TestLeadNamesTheServersThatDidNotConfirm(t *testing.T) {
	api := newFakeAPIServer(t)
	local := "localhost:" + api.port()
	api.answer = func(host string, n int) (int, []byte) {
		if host == local {
			return 409, statusBody(409, "AlreadyExists", `leases.palisade.dev "op" already exists`)
		}
		return 403, statusBody(403, "Forbidden", staleRefusal)
	}
	closed := httptest.NewTLSServer(http.NotFoundHandler())
	closed.Close() // refuses connections
	confirmed := "https://127.0.0.1:" + api.port()
	f := newTestFence(t, api, FenceOptions{
		Servers:        []string{"https://" + local, confirmed, closed.URL},
		ConfirmTimeout: 300 * time.Millisecond,
	})

	start := time.Now()
	err := f.Lead(context.Background(), 42)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("Lead confirmed while a server still accepts token 41")
	}
	t.Log(err)
	msg := err.Error()
	for _, want := range []string{"Lease ops/op, token 42", "2 of 3 API servers", "https://" + local + " (last answer: 409", closed.URL + " (last answer: ", "refuse token 41"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, confirmed+" ") {
		t.Errorf("the error names the server that confirmed: %s", msg)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the error does not wrap context.DeadlineExceeded: %v", err)
	}
	if elapsed < 300*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("Lead gave up after %v, want about 300ms", elapsed)
	}
	// 10ms doubling to 250ms: a handful of asks in 300ms, not hundreds.
	if n := api.askedOf(local); n < 3 || n > 8 {
		t.Errorf("the lagging server was asked %d times in 300ms", n)
	}
	if f.Token() != 42 {
		t.Errorf("Token() = %d after a failed Lead, want 42 (set before confirming)", f.Token())
	}
}

func TestLeadFailsAtOnceWhenTheLeaseIsMissing(t *testing.T) {
	api := newFakeAPIServer(t)
	api.answer = func(string, int) (int, []byte) {
		return 201, []byte(`{"apiVersion":"palisade.dev/v1alpha1","kind":"Lease","metadata":{"name":"op","namespace":"ops"},"spec":{}}`)
	}
	f := newTestFence(t, api, FenceOptions{Servers: []string{api.srv.URL}, ConfirmTimeout: 5 * time.Second})
	start := time.Now()
	err := f.Lead(context.Background(), 42)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), api.srv.URL) {
		t.Fatalf("error %v, want one saying the Lease does not exist, naming the server", err)
	}
	t.Log(err)
	if d := time.Since(start); d > time.Second {
		t.Errorf("Lead took %v to fail on a missing Lease", d)
	}
}

func TestLeadStopsWithItsContext(t *testing.T) {
	api := newFakeAPIServer(t)
	api.answer = func(string, int) (int, []byte) {
		return 409, statusBody(409, "AlreadyExists", "already exists")
	}
	f := newTestFence(t, api, FenceOptions{Servers: []string{api.srv.URL}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := f.Lead(ctx, 42)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stopped before") {
		t.Fatalf("error %v, want the caller's context's end", err)
	}
}

func TestLeadWithoutATokenAsksNothing(t *testing.T) {
	api := newFakeAPIServer(t)
	f := newTestFence(t, api, FenceOptions{Servers: []string{api.srv.URL}})
	for _, token := range []int64{0, -3} {
		if err := f.Lead(context.Background(), token); err != nil {
			t.Errorf("Lead(%d): %v", token, err)
		}
		if f.Token() != 0 {
			t.Errorf("Lead(%d): Token() = %d, want 0", token, f.Token())
		}
	}
	if len(api.probes) != 0 {
		t.Errorf("%d confirm requests for no token", len(api.probes))
	}
}

func TestLeadAsksTheServersTheKubernetesServicePublishes(t *testing.T) {
	api := newFakeAPIServer(t)
	// The servers the slices name: another fake (same test certificate), ready, and
	// an address that is not ready.
	other := newFakeAPIServer(t)
	api.slices = []discoveryv1.EndpointSlice{{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(mustAtoi(t, other.port())))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"127.0.0.1"}},
			{Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
		},
	}}
	f := newTestFence(t, api, FenceOptions{ConfirmTimeout: 5 * time.Second})
	if err := f.Lead(context.Background(), 42); err != nil {
		t.Fatal(err)
	}
	if api.selector != "kubernetes.io/service-name=kubernetes" {
		t.Errorf("listed with selector %q", api.selector)
	}
	if n := other.askedOf("127.0.0.1:" + other.port()); n != 1 {
		t.Errorf("the published server was asked %d times, want 1", n)
	}
	if len(api.probes) != 0 {
		t.Errorf("the config's server was asked %d times though the slices name another", len(api.probes))
	}
}

func TestLeadAsksTheConfigsServerWhenNoneIsPublished(t *testing.T) {
	api := newFakeAPIServer(t)
	f := newTestFence(t, api, FenceOptions{ConfirmTimeout: 5 * time.Second})
	if err := f.Lead(context.Background(), 42); err != nil {
		t.Fatal(err)
	}
	if n := api.askedOf("127.0.0.1:" + api.port()); n != 1 {
		t.Errorf("the config's server was asked %d times, want 1", n)
	}
}

func TestLeadFailsAtOnceWhenTheServersCannotBeListed(t *testing.T) {
	api := newFakeAPIServer(t)
	api.forbid = true
	f := newTestFence(t, api, FenceOptions{ConfirmTimeout: 5 * time.Second})
	start := time.Now()
	err := f.Lead(context.Background(), 42)
	if err == nil || !strings.Contains(err.Error(), "EndpointSlices of Service default/kubernetes") || !strings.Contains(err.Error(), ServersEnv) {
		t.Fatalf("error %v, want one naming the listing and the way around it", err)
	}
	t.Log(err)
	if d := time.Since(start); d > time.Second {
		t.Errorf("a refused listing took %v to fail", d)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
