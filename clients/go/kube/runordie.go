package palisadekube

import (
	"context"
	"errors"
	"fmt"

	palisade "github.com/palisade-dev/palisade/clients/go"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// RunOrDie runs palisade.RunOrDie(ctx, election) with OnStartedLeading replaced: it
// calls f.Lead(ctx, token), then run(ctx, f.Config()). election.Callbacks.OnStartedLeading
// must be nil (RunOrDie panics naming it otherwise); OnStoppedLeading is the caller's.
// election must name the Lease f was made for (Lease, and Namespace unless empty):
// RunOrDie panics otherwise.
//
// run's ctx is cancelled when leadership ends; every client made from the config it
// gets (or from f.Config() earlier) carries the token of this leadership.
//
// A Lead error (the Lease missing, a server that did not confirm within
// ConfirmTimeout, leadership lost meanwhile) is logged (klog, the logger of ctx) and
// leadership is given up by returning from OnStartedLeading without calling run.
// palisade.RunOrDie then does what it does whenever the leader's work ends on its
// own: it releases the Lease (so another candidate, or this process again, is
// granted it with a higher token), calls OnStoppedLeading, and returns. A process
// that exits in OnStoppedLeading restarts as a follower; one that wants to stand
// again calls RunOrDie again.
//
// The rest of the config is palisade.RunOrDie's: it panics on an invalid one.
func RunOrDie(ctx context.Context, f *Fence, election palisade.LeaderElectionConfig, run func(ctx context.Context, cfg *rest.Config)) {
	switch {
	case f == nil:
		panic(errors.New("palisadekube: RunOrDie: the Fence is nil"))
	case run == nil:
		panic(errors.New("palisadekube: RunOrDie: run is nil"))
	case election.Callbacks.OnStartedLeading != nil:
		panic(errors.New("palisadekube: RunOrDie: election.Callbacks.OnStartedLeading must be nil: RunOrDie sets it to confirm the fence, then call run"))
	case election.Lease != f.lease || (election.Namespace != "" && election.Namespace != f.namespace):
		// The token of one Lease confirmed against another's policy proves nothing.
		panic(fmt.Errorf("palisadekube: RunOrDie: election leads by Lease %q in namespace %q, the Fence by %s/%s: they must be the same Lease",
			election.Lease, election.Namespace, f.namespace, f.lease))
	}
	election.Callbacks.OnStartedLeading = func(ctx context.Context, token int64) {
		if err := f.Lead(ctx, token); err != nil {
			klog.FromContext(ctx).Error(err, "palisadekube: giving up leadership: confirming the fencing token failed",
				"lease", f.namespace+"/"+f.lease, "token", token)
			return
		}
		run(ctx, f.Config())
	}
	palisade.RunOrDie(ctx, election)
}
