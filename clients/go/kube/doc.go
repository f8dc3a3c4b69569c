// Package palisadekube fences an operator's writes to the Kubernetes API server with
// the fencing token of the palisade Lease it leads by (docs/operators.md in the
// palisade repository).
//
// The chart's policies.operators names the operator's service account and its Lease;
// the API server then refuses every write of that account (every verb, subresource
// and kind) whose token is lower than the Lease's, or that carries none. This package
// does the operator's part:
//
//   - NewFence learns the config's username (a SelfSubjectReview) and checks it is a
//     service account.
//   - Fence.Config returns a rest.Config whose every request carries the current
//     token, as the impersonation extra palisade.dev/fencing-token of the operator's
//     own service account. Build every client that writes from it.
//   - Fence.Lead sets a new leader's token, then confirms that every API server
//     already refuses the predecessor's (an API server judges with the Lease as its
//     informer has seen it, which lags), before the leader's first write.
//   - RunOrDie is the base client's palisade.RunOrDie with both steps done before
//     the leader's code runs.
//
// It is a module of its own (it needs client-go), so the base client
// (github.com/palisade-dev/palisade/clients/go) stays free of dependencies.
//
// # A client-go controller
//
//	cfg, _ := rest.InClusterConfig()
//	fence, err := palisadekube.NewFence(ctx, cfg, "ops", "my-operator", palisadekube.FenceOptions{})
//	if err != nil { log.Fatal(err) }
//	palisadekube.RunOrDie(ctx, fence, palisade.LeaderElectionConfig{
//		Lease:     "my-operator",
//		Namespace: "ops",
//		Callbacks: palisade.LeaderCallbacks{
//			OnStoppedLeading: func() { os.Exit(0) }, // the kubelet restarts us as a follower
//		},
//		ReleaseOnCancel: true,
//	}, func(ctx context.Context, cfg *rest.Config) {
//		client, err := kubernetes.NewForConfig(cfg) // every request stamped with the token
//		if err != nil { log.Fatal(err) }
//		runController(ctx, client) // until ctx is cancelled: leadership ended
//	})
//
// # controller-runtime
//
// Turn the manager's own leader election off, build the manager from the fenced
// config, and start it while leading:
//
//	palisadekube.RunOrDie(ctx, fence, palisade.LeaderElectionConfig{
//		Lease:     "my-operator",
//		Namespace: "ops",
//		Callbacks: palisade.LeaderCallbacks{OnStoppedLeading: func() { os.Exit(0) }},
//		ReleaseOnCancel: true,
//	}, func(ctx context.Context, cfg *rest.Config) {
//		mgr, err := ctrl.NewManager(cfg, ctrl.Options{LeaderElection: false})
//		if err != nil { log.Fatal(err) }
//		// ... register the reconcilers with mgr ...
//		if err := mgr.Start(ctx); err != nil { log.Fatal(err) }
//	})
//
// A manager built before leading (to warm its caches as a follower) works too, from
// fence.Config(): its clients read the token at every request, and send none until
// Lead, so the API server refuses a follower's writes.
//
// # Which API servers
//
// Lead asks each API server at its own address: FenceOptions.Servers, else
// PALISADE_APISERVERS (comma-separated base URLs), else the ready endpoints of
// Service default/kubernetes, else the config's server. TLS is verified with the
// config's CA against the name the config uses, so an address needs no certificate
// of its own. The chart grants the service account the list of EndpointSlices in
// default and the impersonation of itself with the extra.
package palisadekube
