// Leader election for controller-runtime's example operator (examples/crd: ChaosPods),
// the one file palisade adds to it (source.sh copies the example's main.go, applies
// main.go.patch and adds this file). The patch changes two calls of main:
//
//	ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{})
//	  -> ctrl.NewManager(withLeaderElection(ctrl.GetConfigOrDie, ctrl.Options{}))
//	mgr.Start(ctrl.SetupSignalHandler())
//	  -> startLeading(mgr, ctrl.SetupSignalHandler())
//
// and --election chooses what they do:
//
//	--election=client-go  controller-runtime's own leader election (client-go's, on a
//	                      coordination.k8s.io Lease): the example's options with
//	                      LeaderElection on, the Lease and its timings from the flags;
//	                      mgr.Start as the example calls it.
//	--election=palisade   the manager is made from a palisadekube.Fence's Config, with
//	                      leader election off, and started inside palisadekube.RunOrDie
//	                      on a palisade Lease, through the palisade agent beside it
//	                      (PALISADE_AGENT_SOCKET): every request it sends carries the
//	                      grant's fencing token, so the API server refuses this process's
//	                      writes once a newer leader holds the Lease (docs/operators.md).
//
// Either way the process exits when it stops leading (1; controller-runtime's manager
// does so itself), or when it is told to stop (0, after releasing the Lease).
//
// --stop-grace (palisade only) lets the manager run on that long after leadership
// ended, as an operator that stops slowly (or that is paused again right after it
// learned) does: what it writes meanwhile is a deposed leader's. client-go's elector
// needs none: thawed after its Lease ran out, it still believes it leads until its
// renew deadline passes, and its manager runs on until then.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	palisade "github.com/palisade-dev/palisade/clients/go"
	palisadekube "github.com/palisade-dev/palisade/clients/go/kube"
)

var (
	election       string
	leaseName      string
	leaseNamespace string
	identity       string
	leaseDuration  time.Duration
	renewDeadline  time.Duration
	retryPeriod    time.Duration
	confirmTimeout time.Duration
	stopGrace      time.Duration

	leadershipLog = ctrl.Log.WithName("leadership")
	// fence is the palisade mode's, made by withLeaderElection.
	fence *palisadekube.Fence
)

func init() {
	flag.StringVar(&election, "election", "", "How to elect the leader: client-go (controller-runtime's leader election, a coordination.k8s.io Lease) or palisade (a palisade Lease, through the palisade agent, every write fenced by its token). Required.")
	flag.StringVar(&leaseName, "lease-name", "chaospod", "The Lease to lead by.")
	flag.StringVar(&leaseNamespace, "lease-namespace", os.Getenv("POD_NAMESPACE"), "The Lease's namespace (default: $POD_NAMESPACE; with --election=palisade, empty is the agent's).")
	flag.StringVar(&identity, "identity", os.Getenv("POD_NAME"), "palisade: the holder identity (default: $POD_NAME, else the agent's). client-go: controller-runtime's, <host name>_<uuid>.")
	flag.DurationVar(&leaseDuration, "lease-duration", 15*time.Second, "The Lease's duration.")
	flag.DurationVar(&renewDeadline, "renew-deadline", 10*time.Second, "client-go: how long the leader retries renewing before it gives up leading.")
	flag.DurationVar(&retryPeriod, "retry-period", 2*time.Second, "client-go: the pause between tries to acquire or renew; palisade: between tries to reach the agent.")
	flag.DurationVar(&confirmTimeout, "confirm-timeout", 0, "palisade: how long to wait for every API server to refuse the previous leader's token before leading (0: the integration's default).")
	flag.DurationVar(&stopGrace, "stop-grace", 0, "palisade: how long the manager runs on after leadership ended, before it is stopped and the process exits (0: stopped at once).")
}

// withLeaderElection parses the command line (the example never does), then returns
// the configuration and options to make the manager with: opts, the example's, with
// what --election asks for.
func withLeaderElection(config func() *rest.Config, opts ctrl.Options) (*rest.Config, ctrl.Options) {
	flag.Parse()
	cfg := config()
	switch election {
	case "client-go":
		if leaseNamespace == "" {
			fatal(errors.New("no Lease namespace"), "--election=client-go needs --lease-namespace (or $POD_NAMESPACE)")
		}
		if stopGrace != 0 {
			fatal(errors.New("--stop-grace with --election=client-go"), "--stop-grace is palisade's: controller-runtime stops its manager itself")
		}
		opts.LeaderElection = true
		opts.LeaderElectionID = leaseName
		opts.LeaderElectionNamespace = leaseNamespace
		opts.LeaderElectionReleaseOnCancel = true
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &leaseDuration, &renewDeadline, &retryPeriod
		leadershipLog.Info("Electing a leader", "election", "client-go", "lease", leaseNamespace+"/"+leaseName,
			"leaseDuration", leaseDuration, "renewDeadline", renewDeadline, "retryPeriod", retryPeriod)
		return cfg, opts
	case "palisade":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		fence, err = palisadekube.NewFence(ctx, cfg, leaseNamespace, leaseName, palisadekube.FenceOptions{ConfirmTimeout: confirmTimeout})
		if err != nil {
			fatal(err, "Error building the fence", "lease", leaseName)
		}
		opts.LeaderElection = false
		// Every client of the manager is made from this config: each request carries
		// the token of the leadership it is sent in (none before the first).
		return fence.Config(), opts
	default:
		fatal(fmt.Errorf("--election=%q", election), "--election must be client-go or palisade")
		return nil, opts
	}
}

// startLeading runs the manager: with client-go, as mgr.Start does (its leader election
// runs the controllers while it leads); with palisade, while this process holds the
// palisade Lease, exiting when it stops leading.
func startLeading(mgr ctrl.Manager, ctx context.Context) error {
	if election != "palisade" {
		return mgr.Start(ctx)
	}
	leadershipLog.Info("Electing a leader", "election", "palisade", "lease", leaseName, "namespace", leaseNamespace,
		"identity", identity, "leaseDuration", leaseDuration, "stopGrace", stopGrace)
	var started atomic.Bool
	managerDone := make(chan struct{})
	palisadekube.RunOrDie(ctx, fence, palisade.LeaderElectionConfig{
		Lease:           leaseName,
		Namespace:       leaseNamespace,
		Duration:        leaseDuration,
		Identity:        identity,
		ReleaseOnCancel: true,
		RetryPeriod:     retryPeriod,
		Callbacks: palisade.LeaderCallbacks{
			// Called as soon as the grant is lost (the manager may run on: --stop-grace),
			// or once the manager returned when ctx ended.
			OnStoppedLeading: func() {
				if started.Load() {
					select {
					case <-managerDone:
					case <-time.After(stopGrace + 30*time.Second):
						leadershipLog.Info("The manager did not stop in time: exiting anyway", "stopGrace", stopGrace)
					}
				}
				if ctx.Err() != nil {
					leadershipLog.Info("Stopped; no longer leading", "lease", leaseName)
					os.Exit(0)
				}
				leadershipLog.Info("Leadership lost: exiting", "lease", leaseName)
				os.Exit(1)
			},
		},
	}, func(leaderCtx context.Context, _ *rest.Config) {
		started.Store(true)
		defer close(managerDone)
		leadershipLog.Info("Leading", "election", "palisade", "token", fence.Token())
		runCtx := leaderCtx
		if stopGrace > 0 {
			var cancel context.CancelFunc
			runCtx, cancel = context.WithCancel(ctx)
			defer cancel()
			stop := context.AfterFunc(leaderCtx, func() {
				if ctx.Err() == nil {
					leadershipLog.Info("Leadership lost: the manager runs on", "stopGrace", stopGrace)
				}
				time.AfterFunc(stopGrace, cancel)
			})
			defer stop()
		}
		if err := mgr.Start(runCtx); err != nil {
			leadershipLog.Error(err, "problem running manager")
		}
	})
	return nil
}

func fatal(err error, msg string, kv ...any) {
	leadershipLog.Error(err, msg, kv...)
	os.Exit(1)
}
