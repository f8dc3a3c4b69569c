package palisadekube_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	palisade "github.com/palisade-dev/palisade/clients/go"
	palisadekube "github.com/palisade-dev/palisade/clients/go/kube"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// An operator that leads by Lease ops/my-operator as service account ops/my-operator
// (the chart's policies.operators names both). Its writes go out stamped with the
// token of its grant, only once every API server refuses the predecessor's. A
// controller-runtime manager is built the same way inside run, from cfg, with
// ctrl.Options{LeaderElection: false}, and started with mgr.Start(ctx).
func ExampleRunOrDie() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	fence, err := palisadekube.NewFence(ctx, cfg, "ops", "my-operator", palisadekube.FenceOptions{})
	if err != nil {
		log.Fatal(err) // e.g. the config is not a service account's
	}
	palisadekube.RunOrDie(ctx, fence, palisade.LeaderElectionConfig{
		Lease:     "my-operator",
		Namespace: "ops",
		Callbacks: palisade.LeaderCallbacks{
			OnStoppedLeading: func() { os.Exit(0) }, // the kubelet restarts us as a follower
		},
		ReleaseOnCancel: true,
	}, func(ctx context.Context, cfg *rest.Config) {
		client, err := dynamic.NewForConfig(cfg) // or kubernetes.NewForConfig, ctrl.NewManager
		if err != nil {
			log.Fatal(err)
		}
		widgets := client.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"})
		// Refused by the API server once a newer leader holds the Lease, on every
		// verb and subresource.
		_, err = widgets.Namespace("ops").Patch(ctx, "w1", types.MergePatchType,
			[]byte(`{"status":{"ready":true}}`), metav1.PatchOptions{}, "status")
		if err != nil {
			log.Print(err)
		}
		<-ctx.Done() // lead until leadership ends
	})
}

// The same steps without RunOrDie: a Fence leads with any grant's token.
func ExampleFence_Lead() {
	ctx := context.Background()
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	fence, err := palisadekube.NewFence(ctx, cfg, "ops", "my-operator", palisadekube.FenceOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// Clients made before leading send no token: the API server refuses their writes
	// (reads are not judged), so a follower can warm its caches with them.
	client, err := dynamic.NewForConfig(fence.Config())
	if err != nil {
		log.Fatal(err)
	}

	grant, err := palisade.Acquire(ctx, "my-operator", &palisade.AcquireOptions{Namespace: "ops"})
	if err != nil {
		log.Fatal(err)
	}
	defer grant.Release(context.Background())
	if err := fence.Lead(grant.Context(), grant.Token()); err != nil {
		log.Fatal(err) // a server still accepts the predecessor's token: do not write
	}
	log.Printf("leading as %s with token %d", fence.Username(), fence.Token())
	_ = client // its requests now carry the grant's token
}
