package palisade

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestUnitAcquireOptionsSlot(t *testing.T) {
	for _, n := range []int{0, 1, MaxSlot} {
		if err := (&AcquireOptions{Slot: Slot(n)}).validate(); err != nil {
			t.Errorf("Slot %d refused: %v", n, err)
		}
	}
	for _, n := range []int{-1, MaxSlot + 1} {
		err := (&AcquireOptions{Slot: Slot(n)}).validate()
		if err == nil || !strings.Contains(err.Error(), "AcquireOptions.Slot") {
			t.Errorf("Slot %d: error %v, want one naming AcquireOptions.Slot", n, err)
		}
	}
}

// A bad slot is refused before any request: no claim to let go of.
func TestUnitAcquireOfABadSlotAsksNothing(t *testing.T) {
	f := newFakeAgent(t, 3000, 2000)
	s := f.newSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.Acquire(ctx, "l", &AcquireOptions{Slot: Slot(64)}); err == nil {
		t.Fatal("slot 64 acquired")
	}
	if n := f.count(http.MethodPost + " /v1/sessions/s/leases"); n != 0 {
		t.Errorf("%d acquires sent", n)
	}
}

func TestUnitGrantOfASlotNamesItAndItsFenceKey(t *testing.T) {
	f := newFakeAgent(t, 3000, 2000)
	s := f.newSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g, err := s.Acquire(ctx, "workers", &AcquireOptions{Slot: Slot(2)})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if g.Slot() != 2 || g.FenceKey() != "ns/workers#2" {
		t.Errorf("slot %d, fence key %q; want 2, ns/workers#2", g.Slot(), g.FenceKey())
	}
	if !strings.Contains(g.String(), "slot 2") {
		t.Errorf("String() = %q", g.String())
	}
	lock, err := s.Acquire(ctx, "billing", nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if lock.Slot() != 0 || lock.FenceKey() != "ns/billing" {
		t.Errorf("a lock: slot %d, fence key %q", lock.Slot(), lock.FenceKey())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if slot, ok := f.acquires[0]["slot"]; !ok || slot != float64(2) {
		t.Errorf("the acquire sent slot %v", f.acquires[0])
	}
	if _, ok := f.acquires[1]["slot"]; ok {
		t.Errorf("an acquire of any slot sent one: %v", f.acquires[1])
	}
}

// An agent from before semaphores names neither: the grant is slot 0, keyed as a lock.
func TestUnitGrantFromAnAgentWithoutSlots(t *testing.T) {
	f := newFakeAgent(t, 3000, 2000)
	f.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sessions/s/leases" {
			return false
		}
		writeJSON(w, http.StatusOK, map[string]any{"name": "old", "namespace": "ns", "state": stateHeld,
			"token": 5, "validForMs": 2000, "holderIdentity": "h", "durationSeconds": 15})
		return true
	})
	s := f.newSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g, err := s.Acquire(ctx, "old", nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if g.Slot() != 0 || g.FenceKey() != "ns/old" {
		t.Errorf("slot %d, fence key %q; want 0, ns/old", g.Slot(), g.FenceKey())
	}
}
