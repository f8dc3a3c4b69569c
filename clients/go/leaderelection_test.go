package palisade

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// runElector runs RunOrDie in a goroutine; its panic, if any, comes out of done.
func runElector(ctx context.Context, cfg LeaderElectionConfig) (led <-chan int64, done <-chan error) {
	leading := make(chan int64, 1)
	returned := make(chan error, 1)
	start := cfg.Callbacks.OnStartedLeading
	cfg.Callbacks.OnStartedLeading = func(ctx context.Context, token int64) {
		leading <- token
		if start != nil {
			start(ctx, token)
		}
	}
	if cfg.Callbacks.OnStoppedLeading == nil {
		cfg.Callbacks.OnStoppedLeading = func() {}
	}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				returned <- fmt.Errorf("RunOrDie panicked: %v", p)
			}
			close(returned)
		}()
		RunOrDie(ctx, cfg)
	}()
	return leading, returned
}

func untilDone(ctx context.Context, _ int64) { <-ctx.Done() }

// Two electors of one Lease in one session: the second waits for the first, which
// the agent tells by 409 already_acquired; it must not panic.
func TestUnitTwoElectorsOfOneLeaseTakeTurns(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	s := f.newSession(t)
	cfg := LeaderElectionConfig{Lease: "l", Duration: testDuration, Session: s, ReleaseOnCancel: true,
		RetryPeriod: 50 * time.Millisecond, Callbacks: LeaderCallbacks{OnStartedLeading: untilDone}}

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	ledA, doneA := runElector(ctxA, cfg)
	var tokenA int64
	select {
	case tokenA = <-ledA:
	case err := <-doneA:
		t.Fatalf("elector A returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("elector A does not lead")
	}

	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	ledB, doneB := runElector(ctxB, cfg)
	select {
	case <-ledB:
		t.Fatal("elector B leads while A does")
	case err := <-doneB:
		t.Fatalf("elector B returned while A leads: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	cancelA()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	select {
	case tokenB := <-ledB:
		if tokenB <= tokenA {
			t.Fatalf("B's token %d after A's %d", tokenB, tokenA)
		}
	case err := <-doneB:
		t.Fatalf("elector B returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("elector B does not lead after A released")
	}
	cancelB()
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
}

// A RunOrDie cancelled without ReleaseOnCancel keeps its grant for the session; a
// second RunOrDie of the Lease in that session waits, and returns on its own cancel.
func TestUnitSecondRunOrDieAfterAKeptGrantWaits(t *testing.T) {
	f := newFakeAgent(t, testKeepaliveMs, testValidForMs)
	s := f.newSession(t)
	cfg := LeaderElectionConfig{Lease: "l", Duration: testDuration, Session: s,
		RetryPeriod: 50 * time.Millisecond, Callbacks: LeaderCallbacks{OnStartedLeading: untilDone}}
	ctx1, cancel1 := context.WithCancel(context.Background())
	led1, done1 := runElector(ctx1, cfg)
	select {
	case <-led1:
	case err := <-done1:
		t.Fatalf("first RunOrDie returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("first RunOrDie does not lead")
	}
	cancel1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	led2, done2 := runElector(ctx2, cfg)
	select {
	case <-led2:
		t.Fatal("the second RunOrDie leads while the session keeps the first one's grant")
	case err := <-done2:
		t.Fatalf("the second RunOrDie returned: %v", err)
	case <-time.After(time.Second):
	}
	cancel2()
	select {
	case err := <-done2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the second RunOrDie did not return on cancel")
	}
}
