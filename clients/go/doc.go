// Package palisade is the Go client of the palisade agent: the sidecar (`palisade
// agent`) that holds palisade Leases for the containers of its pod and hands out
// their fencing tokens over a local HTTP API (src/agent/openapi.yaml). The client is
// thin: the agent renews the Leases and enforces their deadlines; the client keeps
// its session alive, reports the agent's word, and stops believing a grant when the
// agent's answers stop (see The timing contract).
//
// # Acquire and fence
//
//	grant, err := palisade.Acquire(ctx, "billing-cron", nil)
//	if err != nil { ... }
//	defer grant.Release(context.Background())
//	for work := range jobs {
//		// The protected resource refuses a token lower than the highest it has seen.
//		if err := store.Write(grant.Context(), work, grant.Token()); err != nil { ... }
//	}
//
// Acquire uses a process-wide session with the agent at PALISADE_AGENT_SOCKET
// (default /run/palisade/agent.sock), or PALISADE_AGENT_URL=http://127.0.0.1:PORT;
// NewSession makes others. Grant.Lost is closed and Grant.Context cancelled when the
// grant is lost; Grant.Err and Grant.ValidFor read the local deadline (no request);
// Grant.Check asks the agent, cheaply, how long the grant is still valid, before a
// write that must not go out late.
//
// # The timing contract
//
// The agent renews each Lease and declares a grant lost on its own clock before the
// controller can hand the Lease on. The client does not rely on hearing that: every
// answer that shows a grant held carries validForMs, the time the agent had left
// before its own deadline, and the client keeps a local deadline per grant, the send
// instant of the latest such request plus its validForMs (so it is never later than
// the agent's). The session asks the agent for itself (GET, which is also the
// keepalive) every min(Keepalive/3, D/6), D the shortest lease duration among the
// held grants, each request bounded by that interval, and every answer renews the
// deadlines; a healthy agent never lets one pass. When the agent stops answering
// (frozen, starved of CPU), the deadline passes: the grant is lost with
// ReasonLocalDeadline, before another holder can be granted, by a timer (Lost
// closes, Context is cancelled) and by Err reading the clock, and stays lost; the
// client then releases its claim in the background. A grant is also lost when the
// agent says so, when the session's event stream ends, and when no request naming
// the session succeeds within the keepalive; Release ends it at once, whatever the
// answer. The application stops its protected work when Lost closes; the fence, not
// the timing, keeps a paused holder's late write out.
//
// # Leader election, and controller-runtime
//
// RunOrDie is leader election in the style of client-go's leaderelection.RunOrDie,
// with a fencing token for the leader. To put a controller-runtime manager behind it,
// turn the manager's own election off and start the manager while leading:
//
//	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{LeaderElection: false})
//	palisade.RunOrDie(ctx, palisade.LeaderElectionConfig{
//		Lease: "my-operator",
//		Callbacks: palisade.LeaderCallbacks{
//			OnStartedLeading: func(ctx context.Context, token int64) {
//				if err := mgr.Start(ctx); err != nil { os.Exit(1) }
//			},
//			OnStoppedLeading: func() { os.Exit(0) }, // the kubelet restarts us as a follower
//		},
//		ReleaseOnCancel: true,
//	})
//
// The reconcilers get the token (a package variable, or a field set before Start) and
// send it with their fenced writes.
//
// # Errors
//
// The agent's error answers are *APIError (Status, Code, Field, Message). A lost
// grant's error is a *LostError, which matches ErrLost; a released grant's is
// ErrReleased.
package palisade
