package palisadekube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

const testUser = "system:serviceaccount:ops:op"

// echoServer answers every request with the request's headers, as JSON.
func echoServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Header)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// headersSent sends a GET with client and returns the headers the server saw.
func headersSent(t *testing.T, client *http.Client, url string) http.Header {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h http.Header
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestConfigSendsNoTokenBeforeLead(t *testing.T) {
	srv := echoServer(t)
	f := &Fence{cfg: &rest.Config{Host: srv.URL}, username: testUser}
	client, err := rest.HTTPClientFor(f.Config())
	if err != nil {
		t.Fatal(err)
	}
	h := headersSent(t, client, srv.URL)
	for _, name := range []string{"Impersonate-User", tokenHeader, "Impersonate-Group"} {
		if v := h.Get(name); v != "" {
			t.Errorf("before Lead, %s: %q; want none", name, v)
		}
	}
	if f.Token() != 0 {
		t.Errorf("Token() = %d before Lead, want 0", f.Token())
	}
}

func TestConfigStampsTheCurrentToken(t *testing.T) {
	srv := echoServer(t)
	f := &Fence{cfg: &rest.Config{Host: srv.URL}, username: testUser}
	// Made before any token: it must see every later one.
	client, err := rest.HTTPClientFor(f.Config())
	if err != nil {
		t.Fatal(err)
	}

	f.setToken(41)
	h := headersSent(t, client, srv.URL)
	if got := h.Get("Impersonate-User"); got != testUser {
		t.Errorf("Impersonate-User: %q, want %q", got, testUser)
	}
	if got := h.Get("Impersonate-Extra-palisade.dev%2Ffencing-token"); got != "41" {
		t.Errorf("the token extra: %q, want 41 (headers %v)", got, h)
	}
	if got := h.Values("Impersonate-Group"); len(got) != 0 {
		t.Errorf("Impersonate-Group: %q; want none (the API server adds a service account's groups)", got)
	}

	f.setToken(42)
	if got := headersSent(t, client, srv.URL).Get(tokenHeader); got != "42" {
		t.Errorf("after a new token, an existing client sent %q, want 42", got)
	}
	if f.Token() != 42 {
		t.Errorf("Token() = %d, want 42", f.Token())
	}

	f.setToken(0)
	h = headersSent(t, client, srv.URL)
	if h.Get("Impersonate-User") != "" || h.Get(tokenHeader) != "" {
		t.Errorf("token 0 is none, but the request carried %v", h)
	}
}

func TestConfigKeepsTheCallersWrapperAndLeavesTheCallersRequestAlone(t *testing.T) {
	srv := echoServer(t)
	cfg := &rest.Config{Host: srv.URL}
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("X-Caller", "yes")
			return next.RoundTrip(r)
		})
	})
	f := &Fence{cfg: rest.CopyConfig(cfg), username: testUser}
	f.setToken(7)
	client, err := rest.HTTPClientFor(f.Config())
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Header
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if h.Get("X-Caller") != "yes" || h.Get(tokenHeader) != "7" {
		t.Errorf("want the caller's header and the token, got %v", h)
	}
	if len(req.Header) != 0 {
		t.Errorf("the caller's request was modified: %v", req.Header)
	}
	if f.cfg.WrapTransport == nil {
		t.Error("the fence's own config lost the caller's wrapper")
	}
}

// A config that impersonates the service account itself (an administrator's, in a
// test) keeps its impersonation, with the fence's user and token on top.
func TestConfigStampsAnImpersonatingConfig(t *testing.T) {
	srv := echoServer(t)
	cfg := &rest.Config{Host: srv.URL, Impersonate: rest.ImpersonationConfig{
		UserName: testUser, Groups: []string{"system:serviceaccounts"}, Extra: map[string][]string{"reason": {"test"}},
	}}
	f := &Fence{cfg: cfg, username: testUser}
	client, err := rest.HTTPClientFor(f.Config())
	if err != nil {
		t.Fatal(err)
	}
	h := headersSent(t, client, srv.URL)
	if h.Get("Impersonate-User") != testUser || h.Get(tokenHeader) != "" {
		t.Errorf("before Lead: want the config's impersonation alone, got %v", h)
	}
	f.setToken(9)
	h = headersSent(t, client, srv.URL)
	if got := h.Values("Impersonate-User"); len(got) != 1 || got[0] != testUser {
		t.Errorf("Impersonate-User: %q, want exactly %q", got, testUser)
	}
	if h.Get(tokenHeader) != "9" || h.Get("Impersonate-Group") != "system:serviceaccounts" || h.Get("Impersonate-Extra-Reason") != "test" {
		t.Errorf("want the token with the config's group and extra, got %v", h)
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestFenceArgumentsAreChecked(t *testing.T) {
	good := &rest.Config{Host: "https://10.96.0.1:443"}
	cases := []struct {
		name       string
		cfg        *rest.Config
		namespace  string
		lease      string
		opts       FenceOptions
		env        string
		wantErr    string
		wantServer []string
	}{
		{name: "nil config", cfg: nil, namespace: "ops", lease: "op", wantErr: "cfg is nil"},
		{name: "no host", cfg: &rest.Config{}, namespace: "ops", lease: "op", wantErr: "cfg.Host is empty"},
		{name: "negative timeout", cfg: good, namespace: "ops", lease: "op",
			opts: FenceOptions{ConfirmTimeout: -time.Second}, wantErr: "ConfirmTimeout is negative"},
		{name: "no namespace", cfg: good, namespace: "", lease: "op", wantErr: `namespace ""`},
		{name: "bad namespace", cfg: good, namespace: "Ops", lease: "op", wantErr: `namespace "Ops"`},
		{name: "no lease", cfg: good, namespace: "ops", lease: "", wantErr: `Lease name ""`},
		{name: "bad lease", cfg: good, namespace: "ops", lease: "my_op", wantErr: `Lease name "my_op"`},
		{name: "server without scheme", cfg: good, namespace: "ops", lease: "op",
			opts: FenceOptions{Servers: []string{"https://10.0.0.1:6443", "10.0.0.2:6443"}}, wantErr: `FenceOptions.Servers: "10.0.0.2:6443" is not`},
		{name: "empty server", cfg: good, namespace: "ops", lease: "op",
			opts: FenceOptions{Servers: []string{""}}, wantErr: `FenceOptions.Servers: "" is not`},
		{name: "server with a query", cfg: good, namespace: "ops", lease: "op",
			opts: FenceOptions{Servers: []string{"https://10.0.0.1:6443?x=1"}}, wantErr: "is not an API server's base URL"},
		{name: "bad env entry", cfg: good, namespace: "ops", lease: "op",
			env: "https://10.0.0.1:6443,ftp://10.0.0.2", wantErr: `PALISADE_APISERVERS: "ftp://10.0.0.2" is not`},
		{name: "env of commas", cfg: good, namespace: "ops", lease: "op", env: " , ", wantErr: "PALISADE_APISERVERS: \" , \" names no server"},
		{name: "servers given", cfg: good, namespace: "ops", lease: "op",
			opts: FenceOptions{Servers: []string{"https://10.0.0.1:6443/", "https://[fd00::1]:6443"}}, env: "https://ignored:1",
			wantServer: []string{"https://10.0.0.1:6443", "https://[fd00::1]:6443"}},
		{name: "servers from env", cfg: good, namespace: "ops", lease: "op", env: " https://10.0.0.1:6443 ,https://10.0.0.2:6443,",
			wantServer: []string{"https://10.0.0.1:6443", "https://10.0.0.2:6443"}},
		{name: "servers discovered", cfg: good, namespace: "ops", lease: "op.example", env: "  "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			servers, err := checkFenceArgs(c.cfg, c.namespace, c.lease, c.opts, c.env)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "palisadekube: NewFence: ") {
					t.Errorf("error %q does not name NewFence", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(servers, " ") != strings.Join(c.wantServer, " ") || (servers == nil) != (c.wantServer == nil) {
				t.Errorf("servers %q, want %q", servers, c.wantServer)
			}
		})
	}
}

func TestOnlyAServiceAccountIsFenced(t *testing.T) {
	if err := checkServiceAccount(testUser); err != nil {
		t.Errorf("%s: %v", testUser, err)
	}
	for _, username := range []string{
		"", "kubernetes-admin", "system:node:n1", "system:serviceaccount:ops",
		"system:serviceaccount::op", "system:serviceaccount:ops:", "system:serviceaccount:ops:op:x",
	} {
		err := checkServiceAccount(username)
		if err == nil {
			t.Errorf("%q accepted as a service account", username)
			continue
		}
		if !strings.Contains(err.Error(), `"`+username+`"`) {
			t.Errorf("the error %q does not name %q", err, username)
		}
	}
}

// NewFence checks its arguments before any request: the error is the bad argument's,
// not the unreachable server's.
func TestNewFenceChecksItsArgumentsFirst(t *testing.T) {
	t.Setenv(ServersEnv, "https://10.0.0.1:6443,10.0.0.2")
	_, err := NewFence(context.Background(), &rest.Config{Host: "https://127.0.0.1:1"}, "ops", "op", FenceOptions{})
	if err == nil || !strings.Contains(err.Error(), `PALISADE_APISERVERS: "10.0.0.2"`) {
		t.Fatalf("error %v, want one naming the bad entry of PALISADE_APISERVERS", err)
	}
}
