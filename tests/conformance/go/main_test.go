package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAgent answers the driver on a Unix socket with one session and one Lease, and
// can freeze: every request is held, as by a SIGSTOPped agent.
type fakeAgent struct {
	stop chan struct{}

	mu         sync.Mutex
	state      string // of the Lease's grant: "", held, lost, released
	validForMs int64
	frozen     chan struct{}
	releaseErr bool // DELETE answers 409 grant_lost, the grant lost as Revoked
	acquires   int  // POSTs of the Lease's claim
}

func startFakeAgent(t *testing.T, validForMs int64) *fakeAgent {
	f := &fakeAgent{stop: make(chan struct{}), validForMs: validForMs}
	grant := func() map[string]any {
		g := map[string]any{"name": "l", "namespace": "ns", "state": f.state, "token": 7,
			"claim": "c", "claimUid": "u", "durationSeconds": 6}
		switch f.state {
		case "held":
			g["validForMs"] = f.validForMs
		case "lost":
			g["lostReason"], g["lostMessage"] = "Revoked", "the pod was deleted"
		}
		return g
	}
	session := func() map[string]any {
		s := map[string]any{"id": "s", "namespace": "ns", "keepaliveMs": 10000, "grants": []any{}}
		if f.state != "" {
			s["grants"] = []any{grant()}
		}
		return s
	}
	answer := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(v)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) { answer(w, 201, session()) })
	mux.HandleFunc("GET /v1/sessions/s", func(w http.ResponseWriter, r *http.Request) { answer(w, 200, session()) })
	mux.HandleFunc("DELETE /v1/sessions/s", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("POST /v1/sessions/s/keepalive", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("GET /v1/sessions/s/events", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		data, _ := json.Marshal(session())
		f.mu.Unlock()
		fmt.Fprintf(w, "event: session\ndata: %s\n\n", data)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-f.stop:
		}
	})
	mux.HandleFunc("POST /v1/sessions/s/leases", func(w http.ResponseWriter, r *http.Request) {
		f.state = "held"
		f.acquires++
		answer(w, 200, grant())
	})
	mux.HandleFunc("GET /v1/sessions/s/leases/ns/l", func(w http.ResponseWriter, r *http.Request) { answer(w, 200, grant()) })
	mux.HandleFunc("DELETE /v1/sessions/s/leases/ns/l", func(w http.ResponseWriter, r *http.Request) {
		if f.releaseErr {
			f.state = "lost"
			answer(w, 409, map[string]string{"error": "grant_lost", "message": "lost already"})
			return
		}
		f.state = "released"
		answer(w, 200, grant())
	})
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		frozen := f.frozen
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
		if !strings.HasSuffix(r.URL.Path, "/events") { // the stream stays open
			f.mu.Lock()
			defer f.mu.Unlock()
		}
		mux.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() {
		close(f.stop)
		srv.Close()
	})
	t.Setenv("PALISADE_AGENT_SOCKET", sock)
	t.Setenv("PALISADE_AGENT_URL", "")
	return f
}

func (f *fakeAgent) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frozen = make(chan struct{})
}

// driver runs the driver; its stdout lines, then its exit status, come out of the
// channels; stdin is the driver's.
func driver(args ...string) (lines <-chan string, status <-chan int, stdin io.WriteCloser) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	out := make(chan string, 1000)
	code := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			out <- sc.Text()
		}
		close(out)
	}()
	go func() {
		code <- run(args, inR, outW, io.Discard)
		outW.Close()
	}()
	return out, code, inW
}

// next is the next line not a write, within d.
func next(t *testing.T, lines <-chan string, d time.Duration) string {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("stdout closed")
			}
			if !strings.HasPrefix(l, "write ") {
				return l
			}
		case <-timeout:
			t.Fatalf("no line but writes within %v", d)
		}
	}
}

// The suite's frozen-agent scenario: a 10 s keepalive, a 6 s lease. The driver must
// say `lost` once the last answer's validForMs is spent, before the controller could
// grant the Lease to another holder (a full duration after the agent's last renewal).
func TestDriverSaysLostWhenTheFrozenAgentsDeadlinePasses(t *testing.T) {
	f := startFakeAgent(t, 4000)
	lines, status, stdin := driver("--lease", "l", "--duration-seconds", "6", "--keepalive-ms", "10000")
	defer stdin.Close()
	if l := next(t, lines, 5*time.Second); l != "granted 7 u 0 ns/l" {
		t.Fatalf("first line %q", l)
	}
	f.freeze()
	frozen := time.Now()
	if l := next(t, lines, 6*time.Second); l != "lost LocalDeadline" {
		t.Fatalf("after the freeze: %q, want lost LocalDeadline", l)
	}
	if took := time.Since(frozen); took > 5*time.Second {
		t.Fatalf("lost %v after the freeze: later than validForMs 4000 allows", took)
	}
	if l := <-lines; !strings.HasPrefix(l, "write 7") {
		t.Fatalf("after lost: %q, want the write in flight", l)
	}
	if code := <-status; code != 3 {
		t.Fatalf("exit %d, want 3", code)
	}
}

// A release that finds the grant lost first prints the agent's reason.
func TestDriverReleaseOfALostGrantSaysWhy(t *testing.T) {
	f := startFakeAgent(t, 4000)
	f.releaseErr = true
	lines, status, stdin := driver("--lease", "l", "--duration-seconds", "6")
	if l := next(t, lines, 5*time.Second); l != "granted 7 u 0 ns/l" {
		t.Fatalf("first line %q", l)
	}
	io.WriteString(stdin, "release\n")
	if l := next(t, lines, 5*time.Second); l != "lost Revoked" {
		t.Fatalf("after release: %q, want lost Revoked", l)
	}
	if code := <-status; code != 3 {
		t.Fatalf("exit %d, want 3", code)
	}
}

// --grants 3: a `release` line releases and acquires again in the same session; stdin's
// end then releases and exits 0 at once, with no third acquire.
func TestDriverGrantsAgainAfterARelease(t *testing.T) {
	f := startFakeAgent(t, 4000)
	lines, status, stdin := driver("--lease", "l", "--grants", "3")
	if l := next(t, lines, 5*time.Second); l != "granted 7 u 0 ns/l" {
		t.Fatalf("first line %q", l)
	}
	io.WriteString(stdin, "release\n")
	for _, want := range []string{"released", "granted 7 u 0 ns/l"} {
		if l := next(t, lines, 5*time.Second); l != want {
			t.Fatalf("after the release line: %q, want %q", l, want)
		}
	}
	stdin.Close()
	if l := next(t, lines, 5*time.Second); l != "released" {
		t.Fatalf("after stdin's end: %q, want released", l)
	}
	if code := <-status; code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.acquires != 2 || f.state != "released" {
		t.Fatalf("%d acquires, the grant %q; want 2 and released", f.acquires, f.state)
	}
}

// --grants must be at least 1.
func TestDriverRefusesZeroGrants(t *testing.T) {
	if code := run([]string{"--lease", "l", "--grants", "0"}, strings.NewReader(""), io.Discard, io.Discard); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
}
