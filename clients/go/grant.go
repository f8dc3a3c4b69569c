package palisade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// A Grant is one Lease held by a session, with its fencing token. Send Token with
// every write the Lease protects; the protected resource refuses it once a newer
// holder has written. A Grant is safe for concurrent use.
type Grant struct {
	session   *Session
	name      string
	namespace string
	holder    string
	claim     string
	claimUID  string
	token     int64
	duration  time.Duration

	lost   chan struct{}
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	state string // held, releasing, lost or released
	err   error
}

const stateReleasing = "releasing"

func newGrant(s *Session, gj grantJSON) *Grant {
	g := &Grant{
		session:   s,
		name:      gj.Name,
		namespace: gj.Namespace,
		holder:    gj.HolderIdentity,
		claim:     gj.Claim,
		claimUID:  gj.ClaimUID,
		token:     gj.Token,
		duration:  time.Duration(gj.DurationSeconds) * time.Second,
		lost:      make(chan struct{}),
		state:     stateHeld,
	}
	g.ctx, g.cancel = context.WithCancelCause(context.Background())
	return g
}

func (g *Grant) key() string { return g.namespace + "/" + g.name }

// Token is the fencing token: strictly higher than every earlier grant's of the Lease.
func (g *Grant) Token() int64 { return g.token }

// Name and Namespace are the Lease's.
func (g *Grant) Name() string      { return g.name }
func (g *Grant) Namespace() string { return g.namespace }

// HolderIdentity is the claim's holder identity; Claim the LeaseClaim's name.
func (g *Grant) HolderIdentity() string { return g.holder }
func (g *Grant) Claim() string          { return g.claim }

// ClaimUID is the LeaseClaim's UID, as Lease.status.holder.claimUID names it.
func (g *Grant) ClaimUID() string { return g.claimUID }

// Duration is the lease duration the grant is held under.
func (g *Grant) Duration() time.Duration { return g.duration }

// Lost is closed when the grant is lost (not when it is released): the agent says so,
// or the session ended. Err then says why.
func (g *Grant) Lost() <-chan struct{} { return g.lost }

// Context is cancelled when the grant ends, lost or released; context.Cause says
// which (an error matching ErrLost, or ErrReleased). Run the protected work under it.
func (g *Grant) Context() context.Context { return g.ctx }

// Err is nil while the grant is held; then a *LostError (matching ErrLost) once it
// was lost, or ErrReleased once it was released.
func (g *Grant) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// LostReason is why the grant was lost, or "" while it was not.
func (g *Grant) LostReason() LostReason {
	var le *LostError
	if errors.As(g.Err(), &le) {
		return le.Reason
	}
	return ""
}

func (g *Grant) releasing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state == stateReleasing
}

// finish ends the grant (lost or released) once; later calls change nothing.
func (g *Grant) finish(state string, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state == stateLost || g.state == stateReleased {
		return
	}
	g.state, g.err = state, err
	if state == stateLost {
		close(g.lost)
	}
	g.cancel(err)
}

// Check asks the agent (cheaply: from its memory, no API server call) whether the
// grant is still held, and for how long at most: call it before a write that must
// not go out late. validFor counts from when Check was called. An ended grant
// returns its Err. Other errors (the agent not answering) say nothing of the grant.
func (g *Grant) Check(ctx context.Context) (validFor time.Duration, err error) {
	if err := g.Err(); err != nil {
		return 0, err
	}
	var gj grantJSON
	sent := time.Now()
	_, err = g.session.request(ctx, answerSlack, http.MethodGet,
		expand(pathLease, g.session.id, g.namespace, g.name), nil, nil, &gj)
	if err != nil {
		if gerr := g.Err(); gerr != nil {
			return 0, gerr
		}
		if isCode(err, CodeUnknownGrant) {
			g.endAs(stateLost, &LostError{Reason: ReasonReleased, Message: "the agent no longer knows the grant"})
			return 0, g.Err()
		}
		return 0, err
	}
	if gj.Token != g.token {
		// Another acquisition of the Lease in this session: this grant ended.
		g.endAs(stateLost, &LostError{Reason: ReasonReleased,
			Message: fmt.Sprintf("the agent's grant has token %d, not %d", gj.Token, g.token)})
		return 0, g.Err()
	}
	g.session.observe(gj)
	if err := g.Err(); err != nil {
		return 0, err
	}
	if gj.State != stateHeld {
		return 0, fmt.Errorf("palisade agent: grant %s in state %q", g.key(), gj.State)
	}
	// Counted from when the request was sent: the agent measured it later.
	left := time.Duration(gj.ValidForMs)*time.Millisecond - time.Since(sent)
	if left < 0 {
		left = 0
	}
	return left, nil
}

// endAs finishes the grant and forgets it in the session.
func (g *Grant) endAs(state string, err error) {
	s := g.session
	s.mu.Lock()
	defer s.mu.Unlock()
	g.finish(state, err)
	if s.grants[g.key()] == g {
		delete(s.grants, g.key())
	}
}

// Release releases the Lease, which the next waiter gets at once. Releasing a grant
// released before returns nil; releasing a lost grant returns its *LostError.
func (g *Grant) Release(ctx context.Context) error {
	g.mu.Lock()
	switch g.state {
	case stateLost:
		err := g.err
		g.mu.Unlock()
		return err
	case stateReleased:
		g.mu.Unlock()
		return nil
	}
	g.state = stateReleasing
	g.mu.Unlock()

	var gj grantJSON
	_, err := g.session.request(ctx, answerSlack, http.MethodDelete,
		expand(pathLease, g.session.id, g.namespace, g.name), nil, nil, &gj)
	switch {
	case err == nil || isCode(err, CodeUnknownGrant):
		g.endAs(stateReleased, ErrReleased)
		return nil
	case isCode(err, CodeGrantLost):
		// Lost before the release: learn why from the grant's state.
		var lj grantJSON
		reason, msg := LostReason(""), "the agent refused the release: the grant was already lost"
		if _, gerr := g.session.request(ctx, answerSlack, http.MethodGet,
			expand(pathLease, g.session.id, g.namespace, g.name), nil, nil, &lj); gerr == nil && lj.State == stateLost {
			reason, msg = LostReason(lj.LostReason), lj.LostMessage
		}
		g.endAs(stateLost, &LostError{Reason: reason, Message: msg})
		return g.Err()
	}
	if gerr := g.Err(); gerr != nil {
		// The session ended meanwhile; its end released the Lease.
		if errors.Is(gerr, ErrReleased) {
			return nil
		}
		return gerr
	}
	// Not known to be released: the grant stays held (retry, or close the session).
	g.mu.Lock()
	if g.state == stateReleasing {
		g.state = stateHeld
	}
	g.mu.Unlock()
	return err
}

func (g *Grant) String() string {
	return fmt.Sprintf("grant %s token %d", g.key(), g.token)
}
