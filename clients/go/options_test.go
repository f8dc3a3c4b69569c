package palisade

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestUnitAcquireOptionsDuration(t *testing.T) {
	for _, d := range []time.Duration{0, time.Second, 15 * time.Second, 24 * time.Hour} {
		if err := (&AcquireOptions{Duration: d}).validate(); err != nil {
			t.Errorf("Duration %v refused: %v", d, err)
		}
	}
	for _, d := range []time.Duration{-time.Second, 500 * time.Millisecond, 1500 * time.Millisecond, 24*time.Hour + time.Second} {
		if err := (&AcquireOptions{Duration: d}).validate(); err == nil || !strings.Contains(err.Error(), "Duration") {
			t.Errorf("Duration %v: error %v, want one naming Duration", d, err)
		}
	}
	if err := (*AcquireOptions)(nil).validate(); err != nil {
		t.Errorf("nil options refused: %v", err)
	}
}

func TestUnitSessionOptionsKeepalive(t *testing.T) {
	for _, d := range []time.Duration{0, time.Second, 1500 * time.Millisecond, time.Minute} {
		if err := (SessionOptions{Keepalive: d}).validate(); err != nil {
			t.Errorf("Keepalive %v refused: %v", d, err)
		}
	}
	for _, d := range []time.Duration{999 * time.Millisecond, time.Minute + time.Millisecond, time.Second + time.Microsecond} {
		if err := (SessionOptions{Keepalive: d}).validate(); err == nil {
			t.Errorf("Keepalive %v accepted", d)
		}
	}
}

func TestUnitEndpoint(t *testing.T) {
	t.Setenv(EnvURL, "")
	t.Setenv(EnvSocket, "")
	cases := []struct {
		socket, url, envSocket, envURL string
		wantSock, wantBase             string
		wantErr                        bool
	}{
		{wantSock: DefaultSocket, wantBase: "http://localhost"},
		{envSocket: "/tmp/a.sock", wantSock: "/tmp/a.sock", wantBase: "http://localhost"},
		{envSocket: "/tmp/a.sock", envURL: "http://127.0.0.1:7000", wantBase: "http://127.0.0.1:7000"},
		{socket: "/tmp/b.sock", envURL: "http://127.0.0.1:7000", wantSock: "/tmp/b.sock", wantBase: "http://localhost"},
		{url: "http://127.0.0.1:7001/", wantBase: "http://127.0.0.1:7001"},
		{url: "https://127.0.0.1:7001", wantErr: true},
		{url: "http://127.0.0.1:7001/v1", wantErr: true},
		{socket: "/tmp/b.sock", url: "http://127.0.0.1:7001", wantErr: true},
	}
	for _, c := range cases {
		t.Setenv(EnvSocket, c.envSocket)
		t.Setenv(EnvURL, c.envURL)
		sock, base, err := endpoint(c.socket, c.url)
		if c.wantErr {
			if err == nil {
				t.Errorf("%+v: no error", c)
			}
			continue
		}
		if err != nil || sock != c.wantSock || base != c.wantBase {
			t.Errorf("%+v: got %q %q %v", c, sock, base, err)
		}
	}
}

func TestUnitWaitMsFollowsTheDeadline(t *testing.T) {
	if got := waitMs(context.Background()); got != maxWait.Milliseconds() {
		t.Errorf("no deadline: %d", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if got := waitMs(ctx); got <= 1000 || got > 2000 {
		t.Errorf("2s deadline: %d", got)
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if got := waitMs(ctx); got != 0 {
		t.Errorf("past deadline: %d", got)
	}
}

func TestUnitExpandEscapesSegments(t *testing.T) {
	if got := expand(pathLease, "s 1", "ns", "a/b"); got != "/v1/sessions/s%201/leases/ns/a%2Fb" {
		t.Errorf("got %q", got)
	}
}

func TestUnitLeaderElectionConfig(t *testing.T) {
	ok := LeaderElectionConfig{Lease: "l", Callbacks: LeaderCallbacks{
		OnStartedLeading: func(context.Context, int64) {}, OnStoppedLeading: func() {}}}
	if err := ok.validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	bad := map[string]func(c *LeaderElectionConfig){
		"Lease":            func(c *LeaderElectionConfig) { c.Lease = "" },
		"OnStartedLeading": func(c *LeaderElectionConfig) { c.Callbacks.OnStartedLeading = nil },
		"OnStoppedLeading": func(c *LeaderElectionConfig) { c.Callbacks.OnStoppedLeading = nil },
		"Duration":         func(c *LeaderElectionConfig) { c.Duration = 100 * time.Millisecond },
		"RetryPeriod":      func(c *LeaderElectionConfig) { c.RetryPeriod = -1 },
	}
	for field, spoil := range bad {
		c := ok
		spoil(&c)
		err := c.validate()
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want one naming it", field, err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: RunOrDie did not panic", field)
				}
			}()
			RunOrDie(context.Background(), c)
		}()
	}
}
