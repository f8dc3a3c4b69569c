package palisade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// LeaderCallbacks are called by RunOrDie, as client-go's leaderelection calls its own.
type LeaderCallbacks struct {
	// OnStartedLeading runs (in its own goroutine) once this process leads, with a
	// context cancelled when it stops leading, and the grant's fencing token: send it
	// with every write the leader makes. Required.
	OnStartedLeading func(ctx context.Context, token int64)
	// OnStoppedLeading is called when RunOrDie returns, whether or not this process
	// led (as in client-go). A leader that lost its Lease usually exits here. Required.
	OnStoppedLeading func()
	// OnNewLeader, optional, is called with this process's holder identity when it
	// starts leading. The agent shows a session only its own grants, so, unlike
	// client-go, it is never called for another process's leadership.
	OnNewLeader func(identity string)
}

// LeaderElectionConfig configures RunOrDie.
type LeaderElectionConfig struct {
	// Lease is the Lease to lead by (required); Namespace its namespace ("" is the
	// agent's own); Duration its leaseDurationSeconds when created (0: the agent's
	// default); Identity the holder identity ("" is the pod's name).
	Lease     string
	Namespace string
	Duration  time.Duration
	Identity  string
	// Callbacks are the leader's code.
	Callbacks LeaderCallbacks
	// Session to acquire in; nil is the process-wide default session.
	Session *Session
	// ReleaseOnCancel releases the Lease when ctx is cancelled while leading, once
	// OnStartedLeading has returned, so the next leader need not wait. Without it the
	// grant is kept until the session ends (usually: the process exits); a later
	// RunOrDie of the Lease in the same session waits until then.
	ReleaseOnCancel bool
	// RetryPeriod is the pause before acquiring again after the agent could not be
	// reached, did not answer, or answered that the session holds or waits for the
	// Lease already (another elector of it in this process); 0 is 1s. A request the
	// agent refused as bad input (400: a bad Lease name, say) is not retried:
	// RunOrDie panics.
	RetryPeriod time.Duration
}

func (c *LeaderElectionConfig) validate() error {
	switch {
	case c.Lease == "":
		return errors.New("palisade: LeaderElectionConfig.Lease is required")
	case c.Callbacks.OnStartedLeading == nil:
		return errors.New("palisade: LeaderCallbacks.OnStartedLeading is required")
	case c.Callbacks.OnStoppedLeading == nil:
		return errors.New("palisade: LeaderCallbacks.OnStoppedLeading is required")
	case c.RetryPeriod < 0:
		return errors.New("palisade: LeaderElectionConfig.RetryPeriod must not be negative")
	}
	return (&AcquireOptions{Duration: c.Duration}).validate()
}

// RunOrDie leads by the Lease cfg.Lease, in the style of client-go's
// leaderelection.RunOrDie: it waits until the Lease is granted, runs
// Callbacks.OnStartedLeading with a context cancelled when leadership ends, and
// returns when the grant is lost (at once, without waiting for OnStartedLeading) or
// when ctx is cancelled (once OnStartedLeading has returned, after releasing the
// Lease when ReleaseOnCancel is set), calling Callbacks.OnStoppedLeading on the way
// out. It panics on an invalid config, or one the agent refuses as bad input.
//
// Two electors of one Lease in one session take turns: while one holds or waits for
// it, the agent refuses the other's acquire (409 already_acquired), which retries
// every RetryPeriod.
//
// Unlike client-go's election, leadership comes with a fencing token: a leader
// paused past its lease that wakes and writes is refused by the fence.
func RunOrDie(ctx context.Context, cfg LeaderElectionConfig) {
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	defer cfg.Callbacks.OnStoppedLeading()

	grant := acquireLeader(ctx, &cfg)
	if grant == nil {
		return
	}
	if cfg.Callbacks.OnNewLeader != nil {
		cfg.Callbacks.OnNewLeader(grant.HolderIdentity())
	}
	leadCtx, cancel := context.WithCancel(grant.Context())
	defer cancel()
	stopLead := context.AfterFunc(ctx, cancel)
	defer stopLead()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		cfg.Callbacks.OnStartedLeading(leadCtx, grant.Token())
	}()

	select {
	case <-grant.Lost():
		return
	case <-ctx.Done():
	case <-finished:
		// The leader's work ended on its own: leadership ends with it.
	}
	cancel()
	<-finished
	if cfg.ReleaseOnCancel || ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*answerSlack)
		defer rcancel()
		if err := grant.Release(rctx); err != nil && !errors.Is(err, ErrLost) {
			fmt.Fprintf(os.Stderr, "palisade: releasing leader Lease %s: %v\n", cfg.Lease, err)
		}
	}
}

// acquireLeader acquires the Lease, retrying after every error but bad input, until
// ctx is done (then nil).
func acquireLeader(ctx context.Context, cfg *LeaderElectionConfig) *Grant {
	retry := cfg.RetryPeriod
	if retry == 0 {
		retry = time.Second
	}
	opts := &AcquireOptions{Namespace: cfg.Namespace, Duration: cfg.Duration, HolderIdentity: cfg.Identity}
	said := "" // the last error told, told again only when it changes
	for {
		var g *Grant
		s := cfg.Session
		var err error
		if s == nil {
			s, err = DefaultSession(ctx)
		}
		if err == nil {
			g, err = s.Acquire(ctx, cfg.Lease, opts)
		}
		if err == nil {
			return g
		}
		if ctx.Err() != nil {
			return nil
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) && (apiErr.Status == http.StatusBadRequest || apiErr.Status == http.StatusUnsupportedMediaType) {
			panic(fmt.Errorf("palisade: acquiring leader Lease %s: %w", cfg.Lease, err))
		}
		if cfg.Session != nil && cfg.Session.Err() != nil {
			// A session given by the caller cannot be replaced: nothing left to try.
			fmt.Fprintf(os.Stderr, "palisade: acquiring leader Lease %s: %v\n", cfg.Lease, cfg.Session.Err())
			return nil
		}
		why := err.Error()
		if isCode(err, CodeAlreadyAcquired) {
			why = "another elector in this session holds or waits for it (or an earlier RunOrDie kept it)"
		}
		if why != said {
			fmt.Fprintf(os.Stderr, "palisade: acquiring leader Lease %s (retrying every %v): %s\n", cfg.Lease, retry, why)
			said = why
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
