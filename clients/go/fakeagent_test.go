package palisade

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// fakeAgent is an agent on a loopback port, for the client's own rules: one session
// "s" in namespace "ns", grants the test controls, and a freeze that holds every
// request, as a SIGSTOPped agent does.
type fakeAgent struct {
	srv  *httptest.Server
	stop chan struct{} // closed at cleanup: frees every held request

	mu          sync.Mutex
	keepaliveMs int64
	validForMs  int64                // every held grant's validForMs
	grants      map[string]grantJSON // by namespace/name
	nextToken   int64
	frozen      chan struct{}                                     // non-nil while frozen; closed on thaw
	hook        func(w http.ResponseWriter, r *http.Request) bool // answers instead, when it returns true
	calls       []string                                          // "METHOD path", in order
	acquires    []map[string]any                                  // each acquire's body, as sent
}

func newFakeAgent(t *testing.T, keepaliveMs, validForMs int64) *fakeAgent {
	t.Helper()
	f := &fakeAgent{stop: make(chan struct{}), keepaliveMs: keepaliveMs, validForMs: validForMs,
		grants: map[string]grantJSON{}, nextToken: 10}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, f.session())
	})
	mux.HandleFunc("GET /v1/sessions/s", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, f.session())
	})
	mux.HandleFunc("DELETE /v1/sessions/s", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sessions/s/keepalive", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/sessions/s/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		data, _ := json.Marshal(f.session())
		fmt.Fprintf(w, "event: session\ndata: %s\n\n", data)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-f.stop:
		}
	})
	mux.HandleFunc("POST /v1/sessions/s/leases", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		var req acquireRequest
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_json", "message": err.Error()})
			return
		}
		json.Unmarshal(raw, &req)
		ns := req.Namespace
		if ns == "" {
			ns = "ns"
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.acquires = append(f.acquires, body)
		key := ns + "/" + req.Name
		if g, ok := f.grants[key]; ok && (g.State == stateHeld || g.State == stateWaiting) {
			writeJSON(w, http.StatusConflict, map[string]string{"error": CodeAlreadyAcquired, "message": "session s holds Lease " + key + " already"})
			return
		}
		d := req.DurationSeconds
		if d == 0 {
			d = 15
		}
		f.nextToken++
		g := grantJSON{Name: req.Name, Namespace: ns, State: stateHeld, Token: f.nextToken, DurationSeconds: d, Claim: "c", ClaimUID: "u",
			FenceKey: key}
		if req.Slot != nil && *req.Slot > 0 {
			// As the agent says it: the slot asked for, and that slot's fence key.
			g.Slot, g.FenceKey = *req.Slot, fmt.Sprintf("%s#%d", key, *req.Slot)
		}
		f.grants[key] = g
		writeJSON(w, http.StatusOK, f.viewLocked(g))
	})
	mux.HandleFunc("GET /v1/sessions/s/leases/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		g, ok := f.grants[r.PathValue("ns")+"/"+r.PathValue("name")]
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": CodeUnknownGrant, "message": "no such grant"})
			return
		}
		writeJSON(w, http.StatusOK, f.viewLocked(g))
	})
	mux.HandleFunc("DELETE /v1/sessions/s/leases/{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		key := r.PathValue("ns") + "/" + r.PathValue("name")
		g, ok := f.grants[key]
		switch {
		case !ok:
			writeJSON(w, http.StatusNotFound, map[string]string{"error": CodeUnknownGrant, "message": "no such grant"})
		case g.State == stateLost:
			writeJSON(w, http.StatusConflict, map[string]string{"error": CodeGrantLost, "message": "lost already"})
		default:
			g.State = stateReleased
			f.grants[key] = g
			writeJSON(w, http.StatusOK, f.viewLocked(g))
		}
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		frozen, hook := f.frozen, f.hook
		f.mu.Unlock()
		if frozen != nil {
			select {
			case <-frozen:
			case <-f.stop:
				return
			case <-r.Context().Done():
				return
			}
		}
		if hook != nil && hook(w, r) {
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		close(f.stop)
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// fakeSession is the Session schema.
type fakeSession struct {
	ID          string      `json:"id"`
	Namespace   string      `json:"namespace"`
	KeepaliveMs int64       `json:"keepaliveMs"`
	Grants      []grantJSON `json:"grants"`
}

func (f *fakeAgent) session() fakeSession {
	f.mu.Lock()
	defer f.mu.Unlock()
	sj := fakeSession{ID: "s", Namespace: "ns", KeepaliveMs: f.keepaliveMs, Grants: []grantJSON{}}
	for _, g := range f.grants {
		sj.Grants = append(sj.Grants, f.viewLocked(g))
	}
	return sj
}

func (f *fakeAgent) viewLocked(g grantJSON) grantJSON {
	if g.State == stateHeld {
		g.ValidForMs = f.validForMs
	}
	return g
}

// freeze holds every request from now on until thaw.
func (f *fakeAgent) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen == nil {
		f.frozen = make(chan struct{})
	}
}

func (f *fakeAgent) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen != nil {
		close(f.frozen)
		f.frozen = nil
	}
}

func (f *fakeAgent) setHook(h func(w http.ResponseWriter, r *http.Request) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = h
}

func (f *fakeAgent) set(g grantJSON) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grants[g.key()] = g
}

func (f *fakeAgent) grant(key string) grantJSON {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.grants[key]
}

// count is how many requests "METHOD path" the agent has had.
func (f *fakeAgent) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == call {
			n++
		}
	}
	return n
}

// newSession starts a session with the fake agent, closed (thawed first) at cleanup.
func (f *fakeAgent) newSession(t *testing.T) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := NewSession(ctx, SessionOptions{URL: f.srv.URL})
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() {
		f.thaw()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}

// eventually polls cond every 10 ms for up to within.
func eventually(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
