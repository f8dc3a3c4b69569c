package palisade

// Integration tests against a real palisade agent (TestAgent*): they need
// PALISADE_AGENT_SOCKET and fail without it. The agent's namespace is shared: every
// Lease name is unique to the test run.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

func agentSocket(t *testing.T) string {
	t.Helper()
	sock := os.Getenv(EnvSocket)
	if sock == "" {
		t.Fatalf("%s is not set: the TestAgent* tests need a running palisade agent "+
			"(the unit tests alone: go test -skip '^TestAgent' ./...)", EnvSocket)
	}
	return sock
}

func leaseName(t *testing.T) string {
	n := strings.ToLower(strings.TrimPrefix(t.Name(), "TestAgent"))
	n = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, n)
	return "go-" + n + "-" + runID
}

func testSession(t *testing.T, opts SessionOptions) *Session {
	t.Helper()
	agentSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := NewSession(ctx, opts)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func acquire(t *testing.T, s *Session, name string, opts *AcquireOptions) *Grant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := s.Acquire(ctx, name, opts)
	if err != nil {
		t.Fatalf("Acquire %s: %v", name, err)
	}
	return g
}

// rawDelete sends a DELETE behind the client's back, as another process could.
func rawDelete(t *testing.T, path string, want int) {
	t.Helper()
	sock := agentSocket(t)
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	req, _ := http.NewRequest(http.MethodDelete, "http://localhost"+path, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("DELETE %s: %v", path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("DELETE %s: status %d, want %d", path, resp.StatusCode, want)
	}
}

func rawEndSession(t *testing.T, id string) {
	t.Helper()
	rawDelete(t, "/v1/sessions/"+id, http.StatusNoContent)
}

func waitClosed(t *testing.T, c <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(within):
		t.Fatalf("%s: not within %v", what, within)
	}
}

func TestAgentAcquireTokenAndCheck(t *testing.T) {
	s := testSession(t, SessionOptions{Name: "go-client-test"})
	name := leaseName(t)
	g := acquire(t, s, name, &AcquireOptions{Duration: 6 * time.Second})
	if g.Token() <= 0 || g.Name() != name || g.Namespace() == "" {
		t.Fatalf("grant: token %d, name %q, namespace %q", g.Token(), g.Name(), g.Namespace())
	}
	if g.Err() != nil || isClosed(g.Lost()) || g.Context().Err() != nil {
		t.Fatalf("a new grant is not held: %v", g.Err())
	}
	ctx := context.Background()
	validFor, err := g.Check(ctx)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	// Two thirds of the 6s duration at most, and the session's keepalive at most.
	if validFor <= 0 || validFor > 4*time.Second {
		t.Fatalf("Check: validFor %v, want within (0, 4s]", validFor)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if g.Err() != ErrReleased || !errors.Is(context.Cause(g.Context()), ErrReleased) || isClosed(g.Lost()) {
		t.Fatalf("after Release: Err %v, cause %v, lost %v", g.Err(), context.Cause(g.Context()), isClosed(g.Lost()))
	}
	if _, err := g.Check(ctx); err != ErrReleased {
		t.Fatalf("Check after Release: %v, want ErrReleased", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

func TestAgentMutualExclusionAndHandover(t *testing.T) {
	a := testSession(t, SessionOptions{})
	b := testSession(t, SessionOptions{})
	name := leaseName(t)
	ga := acquire(t, a, name, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	_, err := b.Acquire(ctx, name, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second session's Acquire while held: %v, want the deadline", err)
	}

	type result struct {
		g   *Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g, err := b.Acquire(ctx, name, nil)
		got <- result{g, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("granted to the second session while the first holds it: %v %v", r.g, r.err)
	case <-time.After(time.Second):
	}
	if ga.Err() != nil {
		t.Fatalf("first grant ended: %v", ga.Err())
	}
	released := time.Now()
	if err := ga.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted within 10s of the release")
	}
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	t.Logf("handover in %v", time.Since(released))
	if r.g.Token() <= ga.Token() {
		t.Fatalf("token %d after %d: tokens must increase", r.g.Token(), ga.Token())
	}
}

func TestAgentCancelledWaitLeavesNoClaim(t *testing.T) {
	a := testSession(t, SessionOptions{})
	b := testSession(t, SessionOptions{})
	c := testSession(t, SessionOptions{})
	name := leaseName(t)
	ga := acquire(t, a, name, nil)
	// b gives up waiting, with its session alive: its claim must not stay queued.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if _, err := b.Acquire(ctx, name, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("b: %v", err)
	}
	cancel()
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g, err := c.Acquire(ctx, name, nil)
		if err == nil && g.Token() <= ga.Token() {
			err = fmt.Errorf("token %d after %d", g.Token(), ga.Token())
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // c queues behind a (and b, if b's claim stayed)
	if err := ga.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("c after a's release (b's cancelled wait must not hold it up): %v", err)
	}
}

func TestAgentLossWhenTheSessionEnds(t *testing.T) {
	s := testSession(t, SessionOptions{})
	name := leaseName(t)
	g := acquire(t, s, name, nil)
	rawEndSession(t, s.ID())
	waitClosed(t, g.Lost(), 5*time.Second, "Lost after the session was ended")
	if g.LostReason() != ReasonSessionEnded || !errors.Is(g.Err(), ErrLost) {
		t.Fatalf("Err = %v (reason %q), want SessionEnded", g.Err(), g.LostReason())
	}
	if !errors.Is(context.Cause(g.Context()), ErrLost) {
		t.Fatalf("Context cause %v", context.Cause(g.Context()))
	}
	waitClosed(t, s.Done(), time.Second, "session Done")
	if err := g.Release(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("Release of a lost grant: %v, want ErrLost", err)
	}
	if _, err := s.Acquire(context.Background(), name, nil); !errors.Is(err, ErrLost) {
		t.Fatalf("Acquire in an ended session: %v, want ErrLost", err)
	}
	// The agent released the Lease with the session: another session gets it at once.
	other := testSession(t, SessionOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g2, err := other.Acquire(ctx, name, nil)
	if err != nil {
		t.Fatalf("Acquire after the session ended: %v", err)
	}
	if g2.Token() <= g.Token() {
		t.Fatalf("token %d after %d", g2.Token(), g.Token())
	}
}

func TestAgentReleaseByAnotherRequestIsALoss(t *testing.T) {
	s := testSession(t, SessionOptions{})
	g := acquire(t, s, leaseName(t), nil)
	rawDelete(t, "/v1/sessions/"+s.ID()+"/leases/"+g.Namespace()+"/"+g.Name(), http.StatusOK)
	waitClosed(t, g.Lost(), 5*time.Second, "Lost after another request released the grant")
	if g.LostReason() != ReasonReleased {
		t.Fatalf("Err = %v, want reason Released", g.Err())
	}
	if s.Err() != nil {
		t.Fatalf("the session ended: %v", s.Err())
	}
}

func TestAgentKeepaliveKeepsTheSession(t *testing.T) {
	// A 1s keepalive: without the client's keepalives the agent ends the session
	// (and its grants) within a second.
	s := testSession(t, SessionOptions{Keepalive: time.Second})
	if s.Keepalive() != time.Second {
		t.Fatalf("Keepalive %v", s.Keepalive())
	}
	g := acquire(t, s, leaseName(t), nil)
	select {
	case <-g.Lost():
		t.Fatalf("lost while the client kept the session alive: %v", g.Err())
	case <-time.After(3500 * time.Millisecond):
	}
	validFor, err := g.Check(context.Background())
	if err != nil || validFor <= 0 || validFor > time.Second {
		t.Fatalf("Check: %v %v, want within (0, 1s] (the keepalive bounds it)", validFor, err)
	}
}

func TestAgentBadLeaseName(t *testing.T) {
	s := testSession(t, SessionOptions{})
	_, err := s.Acquire(context.Background(), "Not_A_Lease!", nil)
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %v (%T), want *APIError", err, err)
	}
	if apiErr.Status != http.StatusBadRequest || apiErr.Field != "name" || apiErr.Code == "" {
		t.Fatalf("got %+v, want 400 naming field name", *apiErr)
	}
	if s.Err() != nil {
		t.Fatalf("a refused request ended the session: %v", s.Err())
	}
}

func TestAgentDefaultSession(t *testing.T) {
	agentSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := Acquire(ctx, leaseName(t), nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	s1, err := DefaultSession(ctx)
	if err != nil || g.Token() <= 0 {
		t.Fatalf("DefaultSession: %v; token %d", err, g.Token())
	}
	if err := s1.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if g.Err() != ErrReleased {
		t.Fatalf("grant after Close: %v, want ErrReleased", g.Err())
	}
	s2, err := DefaultSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	if s2 == s1 || s2.Err() != nil {
		t.Fatal("DefaultSession did not start a new session after the last one ended")
	}
}

func TestAgentRunOrDieReleasesOnCancel(t *testing.T) {
	s := testSession(t, SessionOptions{})
	name := leaseName(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tokens := make(chan int64, 1)
	workEnded := make(chan struct{})
	stopped := make(chan struct{})
	returned := make(chan struct{})
	var leader string
	go func() {
		defer close(returned)
		RunOrDie(ctx, LeaderElectionConfig{
			Lease: name, Session: s, ReleaseOnCancel: true,
			Callbacks: LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context, token int64) {
					tokens <- token
					<-ctx.Done()
					close(workEnded)
				},
				OnStoppedLeading: func() { close(stopped) },
				OnNewLeader:      func(id string) { leader = id },
			},
		})
	}()
	var token int64
	select {
	case token = <-tokens:
	case <-time.After(30 * time.Second):
		t.Fatal("not leading within 30s")
	}
	if token <= 0 {
		t.Fatalf("token %d", token)
	}
	cancel()
	waitClosed(t, returned, 20*time.Second, "RunOrDie's return after cancel")
	if !isClosed(workEnded) || !isClosed(stopped) {
		t.Fatalf("work ended %v, OnStoppedLeading called %v", isClosed(workEnded), isClosed(stopped))
	}
	if leader == "" {
		t.Error("OnNewLeader was not called with this process's identity")
	}
	// Released on cancel: another session is granted at once, with a higher token.
	other := testSession(t, SessionOptions{})
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer acancel()
	g, err := other.Acquire(actx, name, nil)
	if err != nil {
		t.Fatalf("Acquire after the leader released: %v", err)
	}
	if g.Token() <= token {
		t.Fatalf("token %d after %d", g.Token(), token)
	}
}

func TestAgentRunOrDieReturnsOnLoss(t *testing.T) {
	s := testSession(t, SessionOptions{})
	tokens := make(chan int64, 1)
	var workCtx context.Context
	stopped := make(chan struct{})
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		RunOrDie(context.Background(), LeaderElectionConfig{
			Lease: leaseName(t), Session: s,
			Callbacks: LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context, token int64) {
					workCtx = ctx
					tokens <- token
					// A leader that ignores its context: RunOrDie returns anyway.
					select {}
				},
				OnStoppedLeading: func() { close(stopped) },
			},
		})
	}()
	select {
	case <-tokens:
	case <-time.After(30 * time.Second):
		t.Fatal("not leading within 30s")
	}
	rawEndSession(t, s.ID())
	waitClosed(t, returned, 5*time.Second, "RunOrDie's return after the loss")
	if !isClosed(stopped) {
		t.Fatal("OnStoppedLeading not called")
	}
	if workCtx.Err() == nil {
		t.Fatal("the leader's context was not cancelled on the loss")
	}
}
