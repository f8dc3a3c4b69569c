package palisade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// SessionOptions configure NewSession. The zero value is the usual choice.
type SessionOptions struct {
	// Socket is the agent's Unix socket. URL is its loopback TCP address instead
	// (http://127.0.0.1:PORT). Set at most one; with neither, PALISADE_AGENT_URL, then
	// PALISADE_AGENT_SOCKET, then DefaultSocket.
	Socket string
	URL    string
	// Keepalive is how long the agent keeps the session without a request naming it:
	// whole milliseconds from 1s to 60s; 0 takes the agent's default (5s). The client
	// asks for the session every third of it, and more often while it holds grants
	// (Session says how often).
	Keepalive time.Duration
	// Name labels the session in the agent's logs and metrics (e.g. the program's name).
	Name string
}

func (o SessionOptions) validate() error {
	if o.Keepalive != 0 && (o.Keepalive < time.Second || o.Keepalive > time.Minute ||
		o.Keepalive%time.Millisecond != 0) {
		return fmt.Errorf("palisade: SessionOptions.Keepalive %v: must be whole milliseconds from 1s to 60s", o.Keepalive)
	}
	return nil
}

// A Session is one application process's standing with the agent: it keeps the
// session alive and its grants' local deadlines fresh, and reads its event stream.
// Every min(Keepalive/3, D/6), D the shortest lease duration among its held grants,
// it asks the agent for the session (GET, bounded by that interval): the request
// counts as a keepalive, and its answer renews the local deadline of every held
// grant (see Grant). When the stream ends or fails, or no request naming the
// session succeeds within Keepalive of the last that did, the session has ended and
// every grant of it is lost; Done is closed then. Claims of the session that no
// grant or acquire of this process owns (an abandoned acquire's, a release that did
// not arrive) are released when an answer shows them. A Session is safe for
// concurrent use.
type Session struct {
	id        string
	namespace string // the agent's default namespace
	keepalive time.Duration
	agent     *agent

	ctx    context.Context // cancelled when the session ends: stops its loops and requests
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{} // a grant was registered: the refresh interval may be shorter

	mu      sync.Mutex
	err     error                    // why it ended (nil while alive)
	closing bool                     // Close was called: its grants end as released, not lost
	lastOK  time.Time                // when the last request that succeeded was sent
	grants  map[string]*Grant        // held grants, by namespace/name
	seen    map[string]grantJSON     // the stream's last word on each grant that ended, by namespace/name
	keys    map[string]chan struct{} // Leases an acquire or release is under way for: closed when done
	opened  chan struct{}            // closed once the stream's first event arrived
	openErr error
}

func newSession(id, namespace string, keepalive time.Duration, a *agent) *Session {
	s := &Session{
		id:        id,
		namespace: namespace,
		keepalive: keepalive,
		agent:     a,
		done:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
		lastOK:    time.Now(),
		grants:    map[string]*Grant{},
		seen:      map[string]grantJSON{},
		keys:      map[string]chan struct{}{},
		opened:    make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// NewSession starts a session with the agent and opens its event stream. It returns
// once the agent has sent the stream's first event, or with ctx's error.
func NewSession(ctx context.Context, opts SessionOptions) (*Session, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	a, err := newAgent(opts.Socket, opts.URL)
	if err != nil {
		return nil, err
	}
	var sj sessionJSON
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, answerSlack)
	_, err = a.do(rctx, http.MethodPost, pathSessions, nil,
		sessionRequest{KeepaliveMs: opts.Keepalive.Milliseconds(), Name: opts.Name}, &sj)
	cancel()
	if err != nil {
		return nil, err
	}
	if sj.ID == "" || sj.Namespace == "" || sj.KeepaliveMs <= 0 {
		return nil, fmt.Errorf("palisade agent: POST %s: answer without id, namespace or keepaliveMs", pathSessions)
	}
	s := newSession(sj.ID, sj.Namespace, time.Duration(sj.KeepaliveMs)*time.Millisecond, a)
	s.lastOK = sent

	// The stream lives as long as the session; ctx bounds only its opening.
	stop := context.AfterFunc(ctx, s.cancel)
	body, err := a.stream(s.ctx, expand(pathEvents, s.id))
	if err != nil {
		stop()
		s.cancel()
		s.endSession(context.Background())
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	go s.readEvents(body)
	go s.refresh()
	select {
	case <-s.opened:
	case <-ctx.Done():
	}
	s.mu.Lock()
	openErr := s.openErr
	s.mu.Unlock()
	if !stop() || openErr != nil {
		s.Close(context.Background())
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, openErr
	}
	return s, nil
}

// ID is the agent's id of the session.
func (s *Session) ID() string { return s.id }

// Keepalive is the session's keepalive, as the agent granted it.
func (s *Session) Keepalive() time.Duration { return s.keepalive }

// Done is closed when the session has ended (Err says why).
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then why it ended: a *LostError, or
// ErrSessionClosed after Close.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the session: the agent releases every Lease it holds or waits for, and
// its grants end as released. Safe to call more than once.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.mu.Unlock()
	err := s.endSession(ctx)
	s.end(ErrSessionClosed)
	if isCode(err, CodeUnknownSession) {
		err = nil
	}
	return err
}

// endSession asks the agent to end the session (DELETE).
func (s *Session) endSession(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, answerSlack)
	defer cancel()
	_, err := s.agent.do(rctx, http.MethodDelete, expand(pathSession, s.id), nil, nil, nil)
	return err
}

// end marks the session ended with err, ending every grant, once.
func (s *Session) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	if s.closing {
		// Whatever else ended it (the stream closing under the DELETE), Close did.
		err = ErrSessionClosed
	}
	s.err = err
	for key, g := range s.grants {
		if s.closing {
			g.finish(ErrReleased)
		} else {
			g.finish(err)
		}
		delete(s.grants, key)
	}
	if s.openErr == nil {
		select {
		case <-s.opened:
		default:
			s.openErr = err
			close(s.opened)
		}
	}
	close(s.done)
	s.cancel()
}

func (s *Session) lose(reason LostReason, format string, args ...any) {
	s.end(&LostError{Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// touch records a request naming the session that succeeded, sent at sent.
func (s *Session) touch(sent time.Time) {
	s.mu.Lock()
	if sent.After(s.lastOK) {
		s.lastOK = sent
	}
	s.mu.Unlock()
}

// request is agent.do for a request naming the session: bounded by the session's
// life as well as ctx, and counted as a keepalive when it succeeds. An agent that
// no longer knows the session has ended it.
func (s *Session) request(ctx context.Context, timeout time.Duration, method, path string, query url.Values, body, out any) (int, error) {
	if err := s.Err(); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	sent := time.Now()
	status, err := s.agent.do(rctx, method, path, query, body, out)
	if err == nil {
		s.touch(sent)
	} else if isCode(err, CodeUnknownSession) {
		s.lose(ReasonSessionEnded, "the agent no longer knows the session %s", s.id)
	}
	if err != nil && ctx.Err() == nil {
		if serr := s.Err(); serr != nil {
			// The session ended under the request: that is the news, not the
			// cancelled request.
			return status, serr
		}
	}
	return status, err
}

// interval is how often the session asks for itself: a third of the keepalive, and a
// sixth of the shortest lease among held grants, so that a healthy agent's answers
// (each good for at least a third of a lease, from a renewal every third) renew
// every local deadline well before it passes.
func (s *Session) interval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	iv := s.keepalive / 3
	for _, g := range s.grants {
		if d := g.Duration() / 6; d > 0 && d < iv {
			iv = d
		}
	}
	return iv
}

// refresh asks the agent for the session every interval, each request bounded by
// it, and ends the session when none succeeded within the keepalive of the last
// request that did.
func (s *Session) refresh() {
	sent := time.Now() // the session's creation stands for the first
	for {
		interval := s.interval()
		s.mu.Lock()
		missed := s.lastOK.Add(s.keepalive)
		s.mu.Unlock()
		next := sent.Add(interval)
		t := time.NewTimer(min(time.Until(next), time.Until(missed)))
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-s.wake:
			t.Stop()
			continue
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		missed = s.lastOK.Add(s.keepalive)
		s.mu.Unlock()
		if !now.Before(missed) {
			s.lose(ReasonKeepaliveMissed, "no request naming session %s succeeded within its keepalive of %v", s.id, s.keepalive)
			return
		}
		if now.Before(next) {
			continue
		}
		sent = now
		var sj sessionJSON
		// Errors are counted by the keepalive above; an unknown session ends it here.
		if _, err := s.request(s.ctx, min(interval, missed.Sub(now)), http.MethodGet, expand(pathSession, s.id), nil, nil, &sj); err == nil {
			s.took(sj, sent)
		}
	}
}

// took takes the session as the agent answered a request sent at sent: it renews the
// local deadline of each held grant it shows, ends those it shows ended, and lets go
// of claims that no grant or acquire of this process owns.
func (s *Session) took(sj sessionJSON, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gj := range sj.Grants {
		if g := s.grants[gj.key()]; g != nil {
			s.answeredLocked(g, gj, sent)
		} else if gj.State == stateHeld || gj.State == stateWaiting {
			s.letGoLocked(gj.Namespace, gj.Name)
		}
	}
}

// answeredLocked takes an answer naming g, to a request sent at sent. s.mu held.
func (s *Session) answeredLocked(g *Grant, gj grantJSON, sent time.Time) {
	if gj.Token != g.token {
		return
	}
	if gj.State == stateHeld {
		g.setDeadline(gj, sent)
		return
	}
	s.applyLocked(g, gj)
}

// readEvents reads the event stream until it ends, which ends the session.
func (s *Session) readEvents(body io.ReadCloser) {
	defer body.Close()
	stop := context.AfterFunc(s.ctx, func() { body.Close() })
	defer stop()
	r := newSSEReader(body)
	for {
		ev, err := r.Next()
		if err != nil {
			s.lose(ReasonSessionEnded, "the agent's event stream ended: %v", err)
			return
		}
		switch ev.Event {
		case "session":
			var sj sessionJSON
			if err := json.Unmarshal([]byte(ev.Data), &sj); err != nil {
				s.lose(ReasonSessionEnded, "the agent's event stream sent a bad session event: %v", err)
				return
			}
			for _, g := range sj.Grants {
				s.observe(g)
			}
			s.mu.Lock()
			select {
			case <-s.opened:
			default:
				close(s.opened)
			}
			s.mu.Unlock()
		case "grant":
			var g grantJSON
			if err := json.Unmarshal([]byte(ev.Data), &g); err != nil {
				s.lose(ReasonSessionEnded, "the agent's event stream sent a bad grant event: %v", err)
				return
			}
			s.observe(g)
		}
	}
}

// observe takes the stream's word on a grant: a held grant whose token it names and
// which it says is lost or released has ended. Events of another token belong to an
// earlier or later acquisition of the same Lease and are ignored. Held events renew
// nothing: when the stream's reader was paused they may be old news.
func (s *Session) observe(gj grantJSON) {
	if gj.State != stateLost && gj.State != stateReleased {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := gj.key()
	s.seen[key] = gj
	if g := s.grants[key]; g != nil {
		s.applyLocked(g, gj)
	}
}

// applyLocked ends g when gj, of its token, says it ended. s.mu held.
func (s *Session) applyLocked(g *Grant, gj grantJSON) {
	if gj.Token != g.token {
		return
	}
	switch gj.State {
	case stateLost:
		g.finish(&LostError{Reason: LostReason(gj.LostReason), Message: gj.LostMessage})
	case stateReleased:
		// Release forgets the grant before it asks: this release was someone else's.
		g.finish(&LostError{Reason: ReasonReleased, Message: "the agent released the grant, not Grant.Release"})
	default:
		return
	}
	if s.grants[g.key()] == g {
		delete(s.grants, g.key())
	}
}

// register makes g, just granted, a held grant of the session, arms its deadline's
// timer, and applies what the stream already said of it (an answer and the stream
// race).
func (s *Session) register(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		if s.closing {
			g.finish(ErrReleased)
		} else {
			g.finish(s.err)
		}
		return
	}
	s.grants[g.key()] = g
	g.startTimer()
	if gj, ok := s.seen[g.key()]; ok {
		s.applyLocked(g, gj)
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// lockKey waits until no acquire or release of the Lease key is under way in the
// session, and marks one under way until unlock: so a release, or the letting go of
// a claim nobody owns, never reaches a newer acquisition of the same Lease.
func (s *Session) lockKey(ctx context.Context, key string) (unlock func(), err error) {
	for {
		s.mu.Lock()
		busy := s.keys[key]
		if busy == nil {
			done := make(chan struct{})
			s.keys[key] = done
			s.mu.Unlock()
			return func() { s.unlockKey(key, done) }, nil
		}
		s.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Session) unlockKey(key string, done chan struct{}) {
	s.mu.Lock()
	delete(s.keys, key)
	s.mu.Unlock()
	close(done)
}

// letGoLocked releases, in the background, a claim of the session that nobody here
// owns, unless an acquire or release of its Lease is under way (that one decides).
// s.mu held.
func (s *Session) letGoLocked(namespace, name string) {
	key := namespace + "/" + name
	if s.keys[key] != nil || s.err != nil {
		return
	}
	done := make(chan struct{})
	s.keys[key] = done
	go func() {
		defer s.unlockKey(key, done)
		s.letGo(namespace, name)
	}()
}

// letGo releases the session's claim on a Lease, best effort: when it fails, a later
// answer showing the claim tries again. The caller holds the key.
func (s *Session) letGo(namespace, name string) {
	_, _ = s.request(context.Background(), answerSlack, http.MethodDelete,
		expand(pathLease, s.id, namespace, name), nil, nil, nil)
}

// AcquireOptions configure an acquire. The zero value (or nil) takes the agent's
// defaults.
type AcquireOptions struct {
	// Namespace of the Lease; "" is the agent's own (its pod's).
	Namespace string
	// Duration is the Lease's leaseDurationSeconds when the agent creates it (an
	// existing Lease keeps its own): whole seconds from 1s to 24h; 0 is the agent's
	// default (15s).
	Duration time.Duration
	// HolderIdentity is the claim's spec.holderIdentity; "" is the pod's name.
	HolderIdentity string
	// Slot asks for only that slot of a semaphore (0..63; Slot(n) makes one), for
	// work sharded by slot; nil takes any slot, the lowest free one. A lock has slot
	// 0 only; a slot at or above the Lease's permits waits until they are raised.
	Slot *int
}

// MaxSlot is the highest slot a semaphore can have (it has at most 64 permits).
const MaxSlot = 63

// Slot returns a pointer to n, for AcquireOptions.Slot.
func Slot(n int) *int { return &n }

func (o *AcquireOptions) validate() error {
	if o == nil {
		return nil
	}
	if o.Duration != 0 && (o.Duration < time.Second || o.Duration > 24*time.Hour || o.Duration%time.Second != 0) {
		return fmt.Errorf("palisade: AcquireOptions.Duration %v: must be whole seconds from 1s to 24h", o.Duration)
	}
	if o.Slot != nil && (*o.Slot < 0 || *o.Slot > MaxSlot) {
		return fmt.Errorf("palisade: AcquireOptions.Slot %d: must be from 0 to %d (nil for any slot)", *o.Slot, MaxSlot)
	}
	return nil
}

// The longest one request waits for a grant; Acquire resumes the wait after it.
const maxWait = 10 * time.Second

// waitMs is how long the next long poll waits: maxWait, or less when ctx ends sooner.
func waitMs(ctx context.Context) int64 {
	w := maxWait
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d); left < w {
			w = left
		}
	}
	if w < 0 {
		w = 0
	}
	return w.Milliseconds()
}

// Acquire waits until the Lease name is granted to the session, and returns the
// grant. The wait keeps its place in the Lease's queue until ctx is done; then the
// waiting claim is released and ctx's error returned (as it is after any failure
// that may have left a claim). Errors: *APIError for a request the agent refused (an
// invalid name has Field "name"; Code CodeAlreadyAcquired when the session holds or
// waits for the Lease already), an error matching ErrLost when the session ended (or
// the claim was lost while waiting). Acquires and releases of one Lease in a session
// go one at a time: a second acquire waits for the first to return.
func (s *Session) Acquire(ctx context.Context, name string, opts *AcquireOptions) (*Grant, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &AcquireOptions{}
	}
	namespace := opts.Namespace
	if namespace == "" {
		namespace = s.namespace
	}
	unlock, err := s.lockKey(ctx, namespace+"/"+name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g, err := s.acquire(ctx, name, namespace, opts)
	if err != nil && claimMayRemain(err) {
		// Whatever the agent did with the claim, nobody here wants it.
		s.letGo(namespace, name)
	}
	return g, err
}

// claimMayRemain tells whether an acquire that failed with err may have left a claim
// at the agent: not when the agent answered an error (a refused acquire leaves no
// claim, and a 409 is another acquisition's, not to be touched) or said the claim
// ended.
func claimMayRemain(err error) bool {
	var apiErr *APIError
	return !errors.As(err, &apiErr) && !errors.Is(err, ErrLost) && !errors.Is(err, ErrReleased)
}

// acquire asks for the Lease and long-polls until the grant; the caller holds its key.
func (s *Session) acquire(ctx context.Context, name, namespace string, opts *AcquireOptions) (*Grant, error) {
	req := acquireRequest{Name: name, Namespace: opts.Namespace,
		DurationSeconds: int64(opts.Duration / time.Second), HolderIdentity: opts.HolderIdentity,
		Slot: opts.Slot}
	var gj grantJSON
	req.WaitMs = waitMs(ctx)
	sent := time.Now()
	_, err := s.request(ctx, time.Duration(req.WaitMs)*time.Millisecond+answerSlack,
		http.MethodPost, expand(pathLeases, s.id), nil, req, &gj)
	for err == nil && gj.State == stateWaiting && ctx.Err() == nil {
		gj, sent, err = s.getGrant(ctx, namespace, name, waitMs(ctx))
	}
	// A grant that came after a wait is counted from a fresh question: the long poll's
	// send instant may leave little or nothing of the answer's validForMs.
	if err == nil && gj.State == stateHeld && ctx.Err() == nil &&
		time.Since(sent) > time.Duration(gj.ValidForMs)*time.Millisecond/2 {
		gj, sent, err = s.getGrant(ctx, namespace, name, 0)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	switch gj.State {
	case stateHeld:
		g := newGrant(s, gj, sent)
		s.register(g)
		if err := g.Err(); err != nil {
			// Lost at once: its claim goes too, so the Lease moves on.
			s.letGo(namespace, name)
			return nil, err
		}
		return g, nil
	case stateLost:
		return nil, &LostError{Reason: LostReason(gj.LostReason), Message: gj.LostMessage}
	case stateReleased:
		return nil, fmt.Errorf("palisade: acquire %s: the waiting claim was released: %w", name, ErrReleased)
	}
	return nil, fmt.Errorf("palisade agent: acquire %s: unexpected state %q", name, gj.State)
}

// getGrant asks for the session's grant of a Lease, waiting up to wait ms while it
// is waiting; sent is when the request went out.
func (s *Session) getGrant(ctx context.Context, namespace, name string, wait int64) (gj grantJSON, sent time.Time, err error) {
	var q url.Values
	if wait > 0 {
		q = url.Values{queryWaitMs: {strconv.FormatInt(wait, 10)}}
	}
	sent = time.Now()
	_, err = s.request(ctx, time.Duration(wait)*time.Millisecond+answerSlack,
		http.MethodGet, expand(pathLease, s.id, namespace, name), q, nil, &gj)
	return gj, sent, err
}

// The process-wide default session, created on first use and again after it ended.
var (
	defaultMu      sync.Mutex
	defaultSession *Session
)

// DefaultSession returns the process-wide session that Acquire and RunOrDie use,
// starting it (with the zero SessionOptions: the agent from the environment) when
// there is none or the last one ended.
func DefaultSession(ctx context.Context) (*Session, error) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultSession != nil && defaultSession.Err() == nil {
		return defaultSession, nil
	}
	s, err := NewSession(ctx, SessionOptions{})
	if err != nil {
		return nil, err
	}
	defaultSession = s
	return s, nil
}

// Acquire acquires the Lease name in the process-wide default session (see
// DefaultSession and Session.Acquire).
func Acquire(ctx context.Context, name string, opts *AcquireOptions) (*Grant, error) {
	s, err := DefaultSession(ctx)
	if err != nil {
		return nil, err
	}
	return s.Acquire(ctx, name, opts)
}
