// go-leader-redis: a service that elects a leader through the palisade agent (its
// pod's sidecar) and, while leading, appends entries to a Redis list through the
// palisade fence script, so a leader that lost its Lease, and wakes late, cannot
// append after a newer leader did.
//
// Each entry is "<token> <pod> <seq>". Configured by the environment:
//
//	LEASE           the Lease to lead by (go-leader-redis)
//	LEASE_SECONDS   its duration when the agent creates it (5)
//	REDIS_ADDR      host:port of Redis (127.0.0.1:16379)
//	FENCE_KEY       the fenced key (<POD_NAMESPACE>/<LEASE>, as `palisade fence` names it)
//	WRITE_INTERVAL  the pause between two entries (200ms)
//	POD_NAME, POD_NAMESPACE  from the downward API
//	PALISADE_AGENT_SOCKET    the agent's socket (/run/palisade/agent.sock)
//
// The list is palisade:{<FENCE_KEY>}:data:entries. The key's mark is created once,
// when the key is set up (README.md), never by this program: it refuses to start on
// a Redis without the mark, or one set up to lose or roll back marks.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	palisade "github.com/palisade-dev/palisade/clients/go"
	"github.com/palisade-dev/palisade/clients/go/fence"
	"github.com/redis/go-redis/v9"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	lease := env("LEASE", "go-leader-redis")
	pod := env("POD_NAME", "local")
	key := env("FENCE_KEY", env("POD_NAMESPACE", "default")+"/"+lease)
	seconds, err := strconv.Atoi(env("LEASE_SECONDS", "5"))
	if err != nil {
		log.Fatalf("LEASE_SECONDS: %v", err)
	}
	interval, err := time.ParseDuration(env("WRITE_INTERVAL", "200ms"))
	if err != nil {
		log.Fatalf("WRITE_INTERVAL: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS_ADDR", "127.0.0.1:16379")})
	defer rdb.Close()
	if err := fenceReady(ctx, rdb, key); err != nil {
		log.Fatalf("pod %s: %v", pod, err)
	}
	w := &writer{rdb: rdb, script: redis.NewScript(fence.RedisScript), key: key, pod: pod, interval: interval}

	log.Printf("pod %s: waiting to lead by Lease %s (fenced key %s)", pod, lease, key)
	palisade.RunOrDie(ctx, palisade.LeaderElectionConfig{
		Lease:    lease,
		Duration: time.Duration(seconds) * time.Second,
		Callbacks: palisade.LeaderCallbacks{
			OnStartedLeading: w.lead,
			OnStoppedLeading: func() {
				if ctx.Err() != nil {
					log.Printf("pod %s: stopping", pod)
					os.Exit(0)
				}
				// Start over as a follower: the kubelet restarts the container.
				log.Printf("pod %s: stopped leading", pod)
				os.Exit(1)
			},
		},
		ReleaseOnCancel: true,
	})
}

// fenceReady refuses a Redis that can lose or roll back marks, and a key whose mark is
// missing. It never creates the mark: one that Redis lost (a restart without
// persistence, FLUSHALL) would be created again, empty, and a paused leader's older
// token admitted after newer writes.
func fenceReady(ctx context.Context, rdb *redis.Client, key string) error {
	cannotSee, err := fence.CheckSettings(ctx, func(ctx context.Context, name string) (map[string]string, error) {
		return rdb.ConfigGet(ctx, name).Result()
	})
	if err != nil {
		return err
	}
	if cannotSee != "" {
		log.Printf("cannot see the Redis settings the fence needs (%s); make sure of appendonly yes, "+
			"appendfsync always and maxmemory-policy noeviction or volatile-*", cannotSee)
	}
	n, err := rdb.Exists(ctx, fence.MarkKey(key)).Result()
	if err != nil {
		return fmt.Errorf("looking for the fence mark of %s: %w", key, err)
	}
	if n == 0 {
		return &fence.NoMarkError{Key: key}
	}
	return nil
}

type writer struct {
	rdb      *redis.Client
	script   *redis.Script
	key, pod string
	interval time.Duration
}

// lead appends an entry every interval until leadership ends, or the fence refuses
// the token (a newer leader has written: this one's Lease is gone).
func (w *writer) lead(ctx context.Context, token int64) {
	log.Printf("pod %s: leading with fencing token %d", w.pod, token)
	list := fence.DataKey(w.key, "entries")
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for seq := 1; ; seq++ {
		entry := fmt.Sprintf("%d %s %d", token, w.pod, seq)
		// EVALSHA, and EVAL when Redis does not have the script yet.
		err := w.script.Run(ctx, w.rdb, []string{fence.MarkKey(w.key), list},
			strconv.FormatInt(token, 10), w.key, "rpush", entry).Err()
		switch {
		case err == nil || errors.Is(err, redis.Nil): // nil: the key's first token
		case ctx.Err() != nil:
			return
		case strings.HasPrefix(err.Error(), fence.ErrStale):
			log.Printf("pod %s: the fence refused token %d: %v", w.pod, token, err)
			return
		case strings.HasPrefix(err.Error(), fence.ErrNoMark):
			log.Printf("pod %s: %v", w.pod, &fence.NoMarkError{Key: w.key})
			return
		default:
			log.Printf("pod %s: write %d: %v (retrying)", w.pod, seq, err)
		}
		select {
		case <-ctx.Done():
			log.Printf("pod %s: leadership with token %d ended after %d entries: %v", w.pod, token, seq, context.Cause(ctx))
			return
		case <-t.C:
		}
	}
}
