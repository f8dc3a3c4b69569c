package palisade

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A session with no agent behind it (a port nothing listens on), for the rules that
// apply the agent's word.
func offlineSession() *Session {
	a, err := newAgent("", "http://127.0.0.1:1")
	if err != nil {
		panic(err)
	}
	return newSession("s", "ns", time.Minute, a)
}

// held is a held answer, good for a minute.
func held(token int64) grantJSON {
	return grantJSON{Name: "l", Namespace: "ns", State: stateHeld, Token: token, ValidForMs: 60000}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestUnitLossOfTheGrantsToken(t *testing.T) {
	s := offlineSession()
	g := newGrant(s, held(7), time.Now())
	s.register(g)
	// Another acquisition's events (older or newer token) say nothing of this grant.
	s.observe(grantJSON{Name: "l", Namespace: "ns", State: stateLost, Token: 6, LostReason: "Expired"})
	s.observe(grantJSON{Name: "other", Namespace: "ns", State: stateLost, Token: 7})
	if isClosed(g.Lost()) || g.Err() != nil {
		t.Fatalf("lost on another grant's event: %v", g.Err())
	}
	s.observe(grantJSON{Name: "l", Namespace: "ns", State: stateLost, Token: 7, LostReason: "Revoked", LostMessage: "pod deleted"})
	if !isClosed(g.Lost()) {
		t.Fatal("Lost not closed")
	}
	if g.LostReason() != ReasonRevoked || !errors.Is(g.Err(), ErrLost) {
		t.Fatalf("Err = %v", g.Err())
	}
	if !errors.Is(context.Cause(g.Context()), ErrLost) {
		t.Fatalf("Context cause = %v", context.Cause(g.Context()))
	}
	if len(s.grants) != 0 {
		t.Fatal("a lost grant stays registered")
	}
}

func TestUnitLossSeenBeforeTheAnswer(t *testing.T) {
	// The stream told of the loss before the acquire's answer was registered.
	s := offlineSession()
	s.observe(grantJSON{Name: "l", Namespace: "ns", State: stateLost, Token: 9, LostReason: "Expired"})
	g := newGrant(s, held(9), time.Now())
	s.register(g)
	if g.LostReason() != ReasonExpired {
		t.Fatalf("Err = %v, want the loss the stream told first", g.Err())
	}
	// An old acquisition's loss is not this one's.
	g2 := newGrant(s, held(10), time.Now())
	s.register(g2)
	if g2.Err() != nil {
		t.Fatalf("new grant lost on an old event: %v", g2.Err())
	}
}

func TestUnitReleasedEvent(t *testing.T) {
	s := offlineSession()
	g := newGrant(s, held(3), time.Now())
	s.register(g)
	g.end(ErrReleased) // what Release does before it asks
	s.observe(grantJSON{Name: "l", Namespace: "ns", State: stateReleased, Token: 3})
	if g.Err() != ErrReleased || isClosed(g.Lost()) {
		t.Fatalf("our own release: Err = %v, lost closed %v", g.Err(), isClosed(g.Lost()))
	}
	// Released by someone else: this process did not let go, so it lost the grant.
	g2 := newGrant(s, held(4), time.Now())
	s.register(g2)
	s.observe(grantJSON{Name: "l", Namespace: "ns", State: stateReleased, Token: 4})
	if g2.LostReason() != ReasonReleased || !isClosed(g2.Lost()) {
		t.Fatalf("foreign release: Err = %v", g2.Err())
	}
}

func TestUnitSessionEndLosesEveryGrant(t *testing.T) {
	s := offlineSession()
	a, b := newGrant(s, held(1), time.Now()), newGrant(s, grantJSON{Name: "m", Namespace: "ns", State: stateHeld, Token: 2, ValidForMs: 60000}, time.Now())
	s.register(a)
	s.register(b)
	s.lose(ReasonSessionEnded, "stream closed")
	for _, g := range []*Grant{a, b} {
		if g.LostReason() != ReasonSessionEnded || !isClosed(g.Lost()) {
			t.Fatalf("%v: Err = %v", g, g.Err())
		}
	}
	if !isClosed(s.Done()) || s.ctx.Err() == nil {
		t.Fatal("session not ended")
	}
	// A grant answered after the end is lost at once.
	c := newGrant(s, grantJSON{Name: "n", Namespace: "ns", State: stateHeld, Token: 3, ValidForMs: 60000}, time.Now())
	s.register(c)
	if c.LostReason() != ReasonSessionEnded {
		t.Fatalf("late grant: Err = %v", c.Err())
	}
	// The first reason stays.
	s.lose(ReasonKeepaliveMissed, "later")
	if le := new(LostError); !errors.As(s.Err(), &le) || le.Reason != ReasonSessionEnded {
		t.Fatalf("session Err = %v", s.Err())
	}
}

func TestUnitCloseReleasesGrants(t *testing.T) {
	s := offlineSession()
	g := newGrant(s, held(5), time.Now())
	s.register(g)
	s.closing = true
	s.end(ErrSessionClosed)
	if g.Err() != ErrReleased || isClosed(g.Lost()) {
		t.Fatalf("Err = %v, lost closed %v", g.Err(), isClosed(g.Lost()))
	}
}
