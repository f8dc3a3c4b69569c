// Package palisade is the Go client of the palisade agent: the sidecar (`palisade
// agent`) that holds palisade Leases for the containers of its pod and hands out
// their fencing tokens over a local HTTP API (src/agent/openapi.yaml). The client is
// thin: the agent renews the Leases and enforces their deadlines; the client keeps
// its session alive and reports the agent's word.
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
// grant is lost; Grant.Check asks the agent, cheaply, how long the grant is still
// valid, before a write that must not go out late.
//
// # The timing contract
//
// The agent renews each Lease and declares a grant lost on its own clock before the
// controller can hand the Lease on. The application must keep its session alive
// (this package sends a keepalive every third of SessionOptions.Keepalive) and stop
// its protected work when Grant.Lost closes; when no request naming the session
// succeeds within the keepalive, or the session's event stream ends, every grant of
// the session is lost. The fence, not the timing, keeps a paused holder's late write
// out.
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
