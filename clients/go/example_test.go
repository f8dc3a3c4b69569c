package palisade_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	palisade "github.com/palisade-dev/palisade/clients/go"
)

// Acquire a Lease, and send its token with every write it protects.
func ExampleAcquire() {
	ctx := context.Background()
	grant, err := palisade.Acquire(ctx, "billing-cron", &palisade.AcquireOptions{Duration: 15 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer grant.Release(ctx)

	write := func(ctx context.Context, token int64) error { return nil } // a fenced write
	for i := 0; i < 3; i++ {
		if err := write(grant.Context(), grant.Token()); err != nil {
			log.Fatal(err)
		}
	}
	select {
	case <-grant.Lost():
		log.Printf("lost the Lease: %v", grant.Err())
	default:
	}
}

// The controller-runtime swap: the manager's own leader election off
// (ctrl.Options{LeaderElection: false}), the manager started while leading, the
// process gone when leadership ends (the kubelet restarts it as a follower). start
// stands in for mgr.Start, which runs the controllers until its context is cancelled.
func ExampleRunOrDie() {
	start := func(ctx context.Context) error { <-ctx.Done(); return nil } // mgr.Start

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	palisade.RunOrDie(ctx, palisade.LeaderElectionConfig{
		Lease: "my-operator",
		Callbacks: palisade.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context, token int64) {
				// Hand the token to the reconcilers: their fenced writes carry it.
				log.Printf("leading with fencing token %d", token)
				if err := start(ctx); err != nil {
					log.Fatalf("manager: %v", err)
				}
			},
			OnStoppedLeading: func() {
				log.Print("stopped leading")
				os.Exit(0)
			},
		},
		ReleaseOnCancel: true,
	})
}
