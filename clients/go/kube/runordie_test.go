package palisadekube

import (
	"context"
	"fmt"
	"strings"
	"testing"

	palisade "github.com/palisade-dev/palisade/clients/go"
	"k8s.io/client-go/rest"
)

func panicOf(fn func()) (msg string) {
	defer func() { msg = fmt.Sprint(recover()) }()
	fn()
	return "no panic"
}

func TestRunOrDieRefusesItsCallbacksTaken(t *testing.T) {
	f := &Fence{cfg: &rest.Config{Host: "https://127.0.0.1:1"}, namespace: "ops", lease: "op", username: testUser}
	run := func(context.Context, *rest.Config) {}
	stopped := func() {}
	cases := []struct {
		name     string
		fence    *Fence
		election palisade.LeaderElectionConfig
		run      func(context.Context, *rest.Config)
		want     string
	}{
		{"OnStartedLeading set", f, palisade.LeaderElectionConfig{Lease: "op", Callbacks: palisade.LeaderCallbacks{
			OnStartedLeading: func(context.Context, int64) {}, OnStoppedLeading: stopped}}, run, "OnStartedLeading must be nil"},
		{"another Lease", f, palisade.LeaderElectionConfig{Lease: "other", Callbacks: palisade.LeaderCallbacks{OnStoppedLeading: stopped}}, run, `Lease "other"`},
		{"another namespace", f, palisade.LeaderElectionConfig{Lease: "op", Namespace: "dev", Callbacks: palisade.LeaderCallbacks{OnStoppedLeading: stopped}}, run, `namespace "dev"`},
		{"no fence", nil, palisade.LeaderElectionConfig{Lease: "op", Callbacks: palisade.LeaderCallbacks{OnStoppedLeading: stopped}}, run, "Fence is nil"},
		{"no run", f, palisade.LeaderElectionConfig{Lease: "op", Callbacks: palisade.LeaderCallbacks{OnStoppedLeading: stopped}}, nil, "run is nil"},
		// The base RunOrDie's own checks still apply.
		{"no OnStoppedLeading", f, palisade.LeaderElectionConfig{Lease: "op"}, run, "OnStoppedLeading is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := panicOf(func() { RunOrDie(context.Background(), c.fence, c.election, c.run) })
			if !strings.Contains(got, c.want) {
				t.Errorf("panic %q, want one containing %q", got, c.want)
			}
		})
	}
}
