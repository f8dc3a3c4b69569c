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
//
// The grant has a local deadline: the send instant of the latest request whose
// answer showed it held, plus that answer's validForMs (the time the agent had left
// before its own deadline when it answered; counting from the send instant keeps the
// client's deadline before the agent's). The session refreshes it often enough that
// a healthy agent never lets it pass. Once it has passed, the grant is lost
// (ReasonLocalDeadline) for good: Err reads the clock, and a timer closes Lost and
// cancels Context at the deadline, whatever the agent answers later.
type Grant struct {
	session   *Session
	name      string
	namespace string
	holder    string
	claim     string
	claimUID  string
	token     int64
	slot      int
	fenceKey  string

	lost   chan struct{}
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	err      error         // nil while held; then a *LostError or ErrReleased, for good
	duration time.Duration // the lease duration the agent holds the grant under
	deadline time.Time     // the local deadline (monotonic clock)
	answered time.Time     // when the request that set the deadline was sent
	timer    *time.Timer   // loses the grant at the deadline (once registered)
}

// newGrant makes the grant of a held answer to a request sent at sent.
func newGrant(s *Session, gj grantJSON, sent time.Time) *Grant {
	g := &Grant{
		session:   s,
		name:      gj.Name,
		namespace: gj.Namespace,
		holder:    gj.HolderIdentity,
		claim:     gj.Claim,
		claimUID:  gj.ClaimUID,
		token:     gj.Token,
		slot:      gj.Slot,
		fenceKey:  gj.FenceKey,
		lost:      make(chan struct{}),
	}
	if g.fenceKey == "" {
		// An agent from before semaphores: every grant is a lock's, slot 0.
		g.fenceKey = g.key()
	}
	g.ctx, g.cancel = context.WithCancelCause(context.Background())
	g.setDeadline(gj, sent)
	return g
}

func (g *Grant) key() string { return g.namespace + "/" + g.name }

// Token is the fencing token: strictly higher than every earlier grant's of the Lease.
func (g *Grant) Token() int64 { return g.token }

// Slot is the slot the grant holds: 0 on a lock; on a semaphore (a Lease with
// spec.permits above 1) one of 0..permits-1, each with fencing tokens of its own.
func (g *Grant) Slot() int { return g.slot }

// FenceKey is the key the fences use for the grant's slot, as the agent gives it:
// "<namespace>/<name>" for slot 0 (a lock's key), "<namespace>/<name>#<slot>" for the
// others. Pass it to a fence with Token, so that holders of different slots never
// refuse each other.
func (g *Grant) FenceKey() string { return g.fenceKey }

// Name and Namespace are the Lease's.
func (g *Grant) Name() string      { return g.name }
func (g *Grant) Namespace() string { return g.namespace }

// HolderIdentity is the claim's holder identity; Claim the LeaseClaim's name.
func (g *Grant) HolderIdentity() string { return g.holder }
func (g *Grant) Claim() string          { return g.claim }

// ClaimUID is the LeaseClaim's UID, as Lease.status.holder.claimUID names it.
func (g *Grant) ClaimUID() string { return g.claimUID }

// Duration is the lease duration the grant is held under.
func (g *Grant) Duration() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.duration
}

// Lost is closed when the grant is lost (not when it is released): the agent says so,
// the session ended, or the local deadline passed. Err then says why.
func (g *Grant) Lost() <-chan struct{} { return g.lost }

// Context is cancelled when the grant ends, lost or released; context.Cause says
// which (an error matching ErrLost, or ErrReleased). Run the protected work under it.
func (g *Grant) Context() context.Context { return g.ctx }

// Err is nil while the grant is held; then a *LostError (matching ErrLost) once it
// was lost, or ErrReleased once Release was called. It reads the clock: past the
// local deadline the grant is lost, even before its timer has run.
func (g *Grant) Err() error {
	g.mu.Lock()
	err, lapsed := g.err, g.err == nil && !time.Now().Before(g.deadline)
	g.mu.Unlock()
	if lapsed {
		g.expire()
		g.mu.Lock()
		err = g.err
		g.mu.Unlock()
	}
	return err
}

// ValidFor is how long the grant is held at most, on this process's clock (no
// request): the time left before its local deadline, 0 once it ended.
func (g *Grant) ValidFor() time.Duration {
	if g.Err() != nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(0, time.Until(g.deadline))
}

// LostReason is why the grant was lost, or "" while it was not.
func (g *Grant) LostReason() LostReason {
	var le *LostError
	if errors.As(g.Err(), &le) {
		return le.Reason
	}
	return ""
}

// setDeadline believes a held answer to a request sent at sent. An answer to a
// request sent before the one believed says less, and a deadline that has passed
// stays passed: a lost grant never comes back.
func (g *Grant) setDeadline(gj grantJSON, sent time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil || sent.Before(g.answered) || (!g.deadline.IsZero() && !time.Now().Before(g.deadline)) {
		return
	}
	g.answered = sent
	g.deadline = sent.Add(time.Duration(gj.ValidForMs) * time.Millisecond)
	if gj.DurationSeconds > 0 {
		g.duration = time.Duration(gj.DurationSeconds) * time.Second
	}
	if g.timer != nil {
		g.timer.Reset(time.Until(g.deadline))
	}
}

// startTimer arms the timer that loses the grant at its deadline.
func (g *Grant) startTimer() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil && g.timer == nil {
		g.timer = time.AfterFunc(time.Until(g.deadline), g.expire)
	}
}

// expire loses the grant once its local deadline has passed (its timer, or Err
// reading the clock first), and lets go of the claim in the background: the agent
// may still renew it (this process, not the agent, may be the one that paused), and
// the Lease should move on now rather than when the session ends.
func (g *Grant) expire() {
	s := g.session
	s.mu.Lock()
	defer s.mu.Unlock()
	g.mu.Lock()
	lapsed := g.err == nil && !time.Now().Before(g.deadline)
	g.mu.Unlock()
	if !lapsed {
		return
	}
	g.finish(&LostError{Reason: ReasonLocalDeadline,
		Message: "no answer of the agent showed the grant held before its local deadline"})
	if s.grants[g.key()] == g {
		delete(s.grants, g.key())
		s.letGoLocked(g.namespace, g.name)
	}
}

// finish ends the grant with err (a *LostError, or ErrReleased) once; later calls
// change nothing and return false.
func (g *Grant) finish(err error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return false
	}
	g.err = err
	if g.timer != nil {
		g.timer.Stop()
	}
	if errors.Is(err, ErrLost) {
		close(g.lost)
	}
	g.cancel(err)
	return true
}

// end finishes the grant and forgets it in the session.
func (g *Grant) end(err error) bool {
	s := g.session
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grants[g.key()] == g {
		delete(s.grants, g.key())
	}
	return g.finish(err)
}

// Check asks the agent (cheaply: from its memory, no API server call) whether the
// grant is still held, and for how long at most: call it before a write that must
// not go out late. validFor counts from when Check was called; the answer also
// renews the local deadline. An ended grant returns its Err. Other errors (the agent
// not answering) say nothing of the grant.
func (g *Grant) Check(ctx context.Context) (validFor time.Duration, err error) {
	if err := g.Err(); err != nil {
		return 0, err
	}
	s := g.session
	gj, sent, err := s.getGrant(ctx, g.namespace, g.name, 0)
	if err != nil {
		if gerr := g.Err(); gerr != nil {
			return 0, gerr
		}
		if isCode(err, CodeUnknownGrant) {
			g.end(&LostError{Reason: ReasonReleased, Message: "the agent no longer knows the grant"})
			return 0, g.Err()
		}
		return 0, err
	}
	if gj.Token != g.token {
		// Another acquisition of the Lease in this session: this grant ended.
		g.end(&LostError{Reason: ReasonReleased,
			Message: fmt.Sprintf("the agent's grant has token %d, not %d", gj.Token, g.token)})
		return 0, g.Err()
	}
	s.mu.Lock()
	s.answeredLocked(g, gj, sent)
	s.mu.Unlock()
	if err := g.Err(); err != nil {
		return 0, err
	}
	if gj.State != stateHeld {
		return 0, fmt.Errorf("palisade agent: grant %s in state %q", g.key(), gj.State)
	}
	return g.ValidFor(), nil
}

// Release releases the Lease, which the next waiter gets at once. The grant ends
// (ErrReleased) as the request goes out, whatever the answer: the agent stops
// renewing it on the request, and a claim a failed request left is let go by the
// session later. Release returns the request's error, or the *LostError of a grant
// the agent had lost first; releasing a grant released before returns nil, a lost
// one its *LostError.
func (g *Grant) Release(ctx context.Context) error {
	if err := g.Err(); err != nil {
		if errors.Is(err, ErrReleased) {
			return nil
		}
		return err
	}
	s := g.session
	unlock, err := s.lockKey(ctx, g.key())
	if err != nil {
		return err
	}
	defer unlock()
	if !g.end(ErrReleased) {
		// It ended meanwhile.
		if err := g.Err(); !errors.Is(err, ErrReleased) {
			return err
		}
		return nil
	}
	_, err = s.request(ctx, answerSlack, http.MethodDelete,
		expand(pathLease, s.id, g.namespace, g.name), nil, nil, nil)
	switch {
	case err == nil || isCode(err, CodeUnknownGrant) || s.Err() != nil:
		// Released, or the session ended and its end released it.
		return nil
	case isCode(err, CodeGrantLost):
		// Lost before the release: learn why from the grant's state.
		reason, msg := LostReason(""), "the agent refused the release: the grant was already lost"
		if lj, _, gerr := s.getGrant(ctx, g.namespace, g.name, 0); gerr == nil && lj.State == stateLost {
			reason, msg = LostReason(lj.LostReason), lj.LostMessage
		}
		return &LostError{Reason: reason, Message: msg}
	}
	return err
}

func (g *Grant) String() string {
	if g.slot != 0 {
		return fmt.Sprintf("grant %s slot %d token %d", g.key(), g.slot, g.token)
	}
	return fmt.Sprintf("grant %s token %d", g.key(), g.token)
}
