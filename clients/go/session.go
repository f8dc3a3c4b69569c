package palisade

import (
	"context"
	"encoding/json"
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
	// sends a keepalive every third of it.
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
// session alive (a keepalive every third of Keepalive) and reads its event stream.
// When the stream ends or fails, or no request naming the session succeeds within
// Keepalive of the last that did, the session has ended and every grant of it is
// lost; Done is closed then. A Session is safe for concurrent use.
type Session struct {
	id        string
	keepalive time.Duration
	agent     *agent

	ctx    context.Context // cancelled when the session ends: stops its loops and requests
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	err     error                // why it ended (nil while alive)
	closing bool                 // Close was called: its grants end as released, not lost
	lastOK  time.Time            // when the last request that succeeded was sent
	grants  map[string]*Grant    // held grants, by namespace/name
	seen    map[string]grantJSON // the stream's latest word on each grant, by namespace/name
	opened  chan struct{}        // closed once the stream's first event arrived
	openErr error
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
	if sj.ID == "" || sj.KeepaliveMs <= 0 {
		return nil, fmt.Errorf("palisade agent: POST %s: answer without id or keepaliveMs", pathSessions)
	}
	s := &Session{
		id:        sj.ID,
		keepalive: time.Duration(sj.KeepaliveMs) * time.Millisecond,
		agent:     a,
		done:      make(chan struct{}),
		lastOK:    sent,
		grants:    map[string]*Grant{},
		seen:      map[string]grantJSON{},
		opened:    make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())

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
	go s.keepAlive()
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
			g.finish(stateReleased, ErrReleased)
		} else {
			g.finish(stateLost, err)
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

// keepAlive sends a keepalive every third of the session's keepalive, each bounded by
// that third, and ends the session when none succeeded within the keepalive of the
// last request that did.
func (s *Session) keepAlive() {
	interval := s.keepalive / 3
	next := time.Now().Add(interval)
	for {
		s.mu.Lock()
		deadline := s.lastOK.Add(s.keepalive)
		s.mu.Unlock()
		wake := next
		if deadline.Before(wake) {
			wake = deadline
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.mu.Lock()
		deadline = s.lastOK.Add(s.keepalive)
		s.mu.Unlock()
		if !time.Now().Before(deadline) {
			s.lose(ReasonKeepaliveMissed, "no request naming session %s succeeded within its keepalive of %v", s.id, s.keepalive)
			return
		}
		if time.Now().Before(next) {
			continue
		}
		sent := time.Now()
		timeout := interval
		if d := time.Until(deadline); d < timeout {
			timeout = d
		}
		// Errors are counted by the deadline above; an unknown session ends it here.
		_, _ = s.request(s.ctx, timeout, http.MethodPost, expand(pathKeepalive, s.id), nil, nil, nil)
		next = sent.Add(interval)
	}
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

// observe takes the stream's (or an answer's) word on a grant: a held grant whose
// token it names and which it says is lost or released has ended. Events of another
// token belong to an earlier or later acquisition of the same Lease and are ignored.
func (s *Session) observe(gj grantJSON) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := gj.key()
	s.seen[key] = gj
	if g := s.grants[key]; g != nil {
		s.applyLocked(g, gj)
	}
}

func (s *Session) applyLocked(g *Grant, gj grantJSON) {
	if gj.Token != g.token {
		return
	}
	switch gj.State {
	case stateLost:
		g.finish(stateLost, &LostError{Reason: LostReason(gj.LostReason), Message: gj.LostMessage})
	case stateReleased:
		if g.releasing() {
			g.finish(stateReleased, ErrReleased)
		} else {
			g.finish(stateLost, &LostError{Reason: ReasonReleased, Message: "the agent released the grant, not Grant.Release"})
		}
	default:
		return
	}
	if s.grants[g.key()] == g {
		delete(s.grants, g.key())
	}
}

// register makes g, just granted, a held grant of the session, and applies what the
// stream already said of it (an answer and the stream race).
func (s *Session) register(g *Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		if s.closing {
			g.finish(stateReleased, ErrReleased)
		} else {
			g.finish(stateLost, s.err)
		}
		return
	}
	s.grants[g.key()] = g
	if gj, ok := s.seen[g.key()]; ok {
		s.applyLocked(g, gj)
	}
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
}

func (o *AcquireOptions) validate() error {
	if o == nil || o.Duration == 0 {
		return nil
	}
	if o.Duration < time.Second || o.Duration > 24*time.Hour || o.Duration%time.Second != 0 {
		return fmt.Errorf("palisade: AcquireOptions.Duration %v: must be whole seconds from 1s to 24h", o.Duration)
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
// waiting claim is released and ctx's error returned. Errors: *APIError for a request
// the agent refused (an invalid name has Field "name"), an error matching ErrLost when
// the session ended (or the claim was lost while waiting).
func (s *Session) Acquire(ctx context.Context, name string, opts *AcquireOptions) (*Grant, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &AcquireOptions{}
	}
	req := acquireRequest{Name: name, Namespace: opts.Namespace,
		DurationSeconds: int64(opts.Duration / time.Second), HolderIdentity: opts.HolderIdentity}
	var gj grantJSON
	req.WaitMs = waitMs(ctx)
	_, err := s.request(ctx, time.Duration(req.WaitMs)*time.Millisecond+answerSlack,
		http.MethodPost, expand(pathLeases, s.id), nil, req, &gj)
	namespace := opts.Namespace
	if err == nil && gj.Namespace != "" {
		namespace = gj.Namespace
	}
	for err == nil && gj.State == stateWaiting && ctx.Err() == nil {
		w := waitMs(ctx)
		q := url.Values{queryWaitMs: {strconv.FormatInt(w, 10)}}
		gj = grantJSON{}
		_, err = s.request(ctx, time.Duration(w)*time.Millisecond+answerSlack,
			http.MethodGet, expand(pathLease, s.id, namespace, name), q, nil, &gj)
	}
	if ctx.Err() != nil {
		// Whatever the agent did with the claim, this caller no longer wants it.
		s.abandon(name, namespace)
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	switch gj.State {
	case stateHeld:
		g := newGrant(s, gj)
		s.register(g)
		return g, nil
	case stateLost:
		return nil, &LostError{Reason: LostReason(gj.LostReason), Message: gj.LostMessage}
	case stateReleased:
		return nil, fmt.Errorf("palisade: acquire %s: the waiting claim was released: %w", name, ErrReleased)
	}
	return nil, fmt.Errorf("palisade agent: acquire %s: unexpected state %q", name, gj.State)
}

// abandon releases a claim whose acquire was given up. Without a namespace (the
// agent's default, not yet answered) it looks the grant up in the session.
func (s *Session) abandon(name, namespace string) {
	if s.Err() != nil {
		return // the agent released everything of the session
	}
	ctx := context.Background()
	if namespace == "" {
		var sj sessionJSON
		if _, err := s.request(ctx, answerSlack, http.MethodGet, expand(pathSession, s.id), nil, nil, &sj); err != nil {
			return
		}
		for _, g := range sj.Grants {
			if g.Name == name && (g.State == stateWaiting || g.State == stateHeld) {
				namespace = g.Namespace
			}
		}
		if namespace == "" {
			return
		}
	}
	// On failure the claim is left to the session, whose end releases it.
	_, _ = s.request(ctx, answerSlack, http.MethodDelete, expand(pathLease, s.id, namespace, name), nil, nil, nil)
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
