package palisade

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Grants of 3s (a refresh every half second), believed 1.8s from each answer, in a
// session whose keepalive (60s) alone would not look for 20s.
const (
	testKeepaliveMs = 60000
	testValidForMs  = 1800
	testDuration    = 3 * time.Second
)

func acquireFake(t *testing.T, s *Session, name string) *Grant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := s.Acquire(ctx, name, &AcquireOptions{Duration: testDuration})
	if err != nil {
		t.Fatalf("Acquire %s: %v", name, err)
	}
	return g
}

func TestUnitFrozenAgentLosesTheGrantByItsDeadline(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	f.freeze()
	frozen := time.Now()
	select {
	case <-g.Lost():
	case <-time.After(3 * time.Second):
		t.Fatalf("still held %v after the agent froze, with validForMs %d: Err %v",
			time.Since(frozen).Round(time.Millisecond), testValidForMs, g.Err())
	}
	if took := time.Since(frozen); took > testValidForMs*time.Millisecond+500*time.Millisecond {
		t.Errorf("lost %v after the freeze: later than the last answer's validForMs allows", took)
	}
	if g.LostReason() != ReasonLocalDeadline {
		t.Errorf("Err = %v, want reason LocalDeadline", g.Err())
	}
	if !errors.Is(context.Cause(g.Context()), ErrLost) {
		t.Errorf("Context cause %v, want the loss", context.Cause(g.Context()))
	}
}

func TestUnitHealthyAgentKeepsTheGrantWithSessionGETs(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	// Longer than one answer's validForMs: only refreshes keep the grant.
	time.Sleep(2500 * time.Millisecond)
	if err := g.Err(); err != nil {
		t.Fatalf("lost while the agent answered: %v", err)
	}
	gets := f.count("GET /v1/sessions/s")
	if gets < 3 {
		t.Fatalf("%d GETs of the session in 2.5s with a %v grant, want one every sixth of it", gets, testDuration)
	}
	if n := f.count("POST /v1/sessions/s/keepalive"); n != 0 {
		t.Errorf("%d keepalive POSTs: the session GET is the keepalive", n)
	}
}

func TestUnitLostGrantStaysLostAndIsReleased(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	f.freeze()
	select {
	case <-g.Lost():
	case <-time.After(3 * time.Second):
		t.Fatalf("not lost 3s after the agent froze: Err %v", g.Err())
	}
	// The agent wakes and still says held: the loss stands, and the claim is let go.
	f.thaw()
	if !eventually(2*time.Second, func() bool { return f.grant("ns/l").State == stateReleased }) {
		t.Errorf("the grant lost by its deadline was not released (agent says %q)", f.grant("ns/l").State)
	}
	time.Sleep(600 * time.Millisecond)
	if g.LostReason() != ReasonLocalDeadline || s.Err() != nil {
		t.Fatalf("after the agent woke: grant Err %v, session Err %v", g.Err(), s.Err())
	}
}

func TestUnitGrantAfterALongPollCountsFromAFreshAnswer(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	// Waiting first; the long poll is answered held after longer than validForMs.
	f.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions/s/leases":
			g := grantJSON{Name: "l", Namespace: "ns", State: stateWaiting, Claim: "c"}
			f.set(g)
			writeJSON(w, http.StatusAccepted, g)
			return true
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sessions/s/leases/ns/l" && r.URL.Query().Get(queryWaitMs) != "":
			time.Sleep(2200 * time.Millisecond)
			f.set(grantJSON{Name: "l", Namespace: "ns", State: stateHeld, Token: 11, Claim: "c", ClaimUID: "u", DurationSeconds: 3})
			return false
		}
		return false
	})
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	if err := g.Err(); err != nil {
		t.Fatalf("a grant answered after a long poll is lost at once: %v", err)
	}
	time.Sleep(time.Second)
	if err := g.Err(); err != nil {
		t.Fatalf("lost while the agent answered: %v", err)
	}
}

func TestUnitFailedReleaseIsNeverHeldAgain(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	f.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodDelete && r.URL.Path == "/v1/sessions/s/leases/ns/l" {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "kubernetes_unavailable",
				"message": "the claim's deletion did not finish in time; the grant ends at its deadline"})
			return true
		}
		return false
	})
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	err := g.Release(context.Background())
	if err == nil {
		t.Fatal("Release answered 503 returned nil")
	}
	// The agent stopped renewing on the request: whatever it answered, not held.
	for i := 0; i < 2; i++ {
		if g.Err() == nil || g.Context().Err() == nil {
			t.Fatalf("after a failed release (%v): Err %v, Context %v: the grant reads as held", err, g.Err(), g.Context().Err())
		}
		time.Sleep(time.Second) // the agent's answers still say held
	}
	if _, err := g.Check(context.Background()); err == nil {
		t.Fatal("Check after a failed release: held")
	}
}

// A request the client sends for a waiting claim fails at the transport: the claim
// is let go, not left waiting (and then held) for the session's life.
func TestUnitFailedAcquireReleasesItsClaim(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	f.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions/s/leases":
			g := grantJSON{Name: "l", Namespace: "ns", State: stateWaiting, Claim: "c"}
			f.set(g)
			writeJSON(w, http.StatusAccepted, g)
			return true
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sessions/s/leases/ns/l" && r.URL.Query().Get(queryWaitMs) != "":
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return true
		}
		return false
	})
	s := f.newSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.Acquire(ctx, "l", &AcquireOptions{Duration: testDuration})
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Acquire: %v (ctx %v), want the transport's error", err, ctx.Err())
	}
	if !eventually(2*time.Second, func() bool { return f.grant("ns/l").State == stateReleased }) {
		t.Fatalf("the waiting claim stays %q after the acquire failed (%v): a zombie the session keeps", f.grant("ns/l").State, err)
	}
}

// A claim of the session that no acquire or grant of this client owns (an
// abandoned acquire's, a release that never arrived) is released; the client's own
// grant is not.
func TestUnitClaimsNobodyOwnsAreReleased(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	f.set(grantJSON{Name: "z", Namespace: "ns", State: stateHeld, Token: 5, DurationSeconds: 3})
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	if !eventually(3*time.Second, func() bool { return f.grant("ns/z").State == stateReleased }) {
		t.Fatalf("the claim nobody owns stays %q", f.grant("ns/z").State)
	}
	if n := f.count("DELETE /v1/sessions/s/leases/ns/l"); n != 0 || g.Err() != nil {
		t.Fatalf("the client's own grant: %d DELETEs, Err %v", n, g.Err())
	}
}

// Err reads the clock: past the local deadline the grant is lost even when its timer
// has not run, and no later answer brings it back.
func TestUnitErrReadsTheClock(t *testing.T) {
	s := offlineSession()
	g := newGrant(s, grantJSON{Name: "l", Namespace: "ns", State: stateHeld, Token: 3, ValidForMs: 100}, time.Now())
	s.register(g)
	g.timer.Stop() // as if the timer's goroutine were late
	if err := g.Err(); err != nil {
		t.Fatalf("lost before its deadline: %v", err)
	}
	time.Sleep(150 * time.Millisecond)
	// A fresh answer after the deadline passed changes nothing.
	g.setDeadline(held(3), time.Now())
	if g.LostReason() != ReasonLocalDeadline || !isClosed(g.Lost()) || g.Context().Err() == nil {
		t.Fatalf("past the deadline: Err %v, Lost closed %v", g.Err(), isClosed(g.Lost()))
	}
	if g.ValidFor() != 0 {
		t.Fatalf("ValidFor %v after the loss", g.ValidFor())
	}
	if len(s.grants) != 0 {
		t.Fatal("a grant lost by its deadline stays registered")
	}
}

// A session GET that hangs is given up after the refresh interval, and the next one
// renews the deadlines in time.
func TestUnitSlowAnswerDoesNotHoldUpTheRefresh(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	s := f.newSession(t)
	g := acquireFake(t, s, "l")
	var once sync.Once
	f.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		hang := false
		if r.Method == http.MethodGet && r.URL.Path == "/v1/sessions/s" {
			once.Do(func() { hang = true })
		}
		if hang {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
		return hang
	})
	time.Sleep(3 * time.Second)
	if err := g.Err(); err != nil {
		t.Fatalf("lost behind one hung answer: %v", err)
	}
}
