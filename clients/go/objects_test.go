package palisade

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// The object store of the TestAgent* runs: tests/clients.rs gives its agent S3
// credentials, makes a bucket, and writes one object in it with a token no grant
// reaches, as a newer holder would have.
const (
	envObjectBucket = "PALISADE_TEST_S3_BUCKET"
	envStaleKey     = "PALISADE_TEST_S3_STALE_KEY"
)

func objectStore(t *testing.T) (bucket, staleKey string) {
	t.Helper()
	bucket, staleKey = os.Getenv(envObjectBucket), os.Getenv(envStaleKey)
	if bucket == "" || staleKey == "" {
		t.Fatalf("%s and %s are not set: tests/clients.rs sets them for its agent, whose S3 server "+
			"(PALISADE_TEST_S3) holds them", envObjectBucket, envStaleKey)
	}
	return bucket, staleKey
}

func TestUnitDecodeStaleToken(t *testing.T) {
	e := decodeAPIError(409, []byte(`{"error":"stale_token","message":"m","key":"k","token":4,"highest":9}`))
	if e.Code != CodeStaleToken || e.stale == nil || e.stale.Highest != 9 || e.stale.Token != 4 {
		t.Fatalf("got %+v (stale %+v)", *e, e.stale)
	}
	if e := decodeAPIError(409, []byte(`{"error":"grant_lost","message":"m"}`)); e.stale != nil {
		t.Fatalf("grant_lost decoded as stale: %+v", *e)
	}
}

func TestAgentPutObject(t *testing.T) {
	bucket, staleKey := objectStore(t)
	s := testSession(t, SessionOptions{Name: "go-client-test"})
	name := leaseName(t)
	g := acquire(t, s, name, &AcquireOptions{Duration: 6 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "go/" + name + "/report.csv"

	w, err := g.PutObject(ctx, bucket, key, []byte("a,b\n1,2\n"))
	if err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	if w.Token != g.Token() || w.Bucket != bucket || w.Key != key || w.PreviousToken != 0 || w.ETag == "" {
		t.Fatalf("PutObject: %+v, want token %d, bucket %q, key %q, a new object", w, g.Token(), bucket, key)
	}
	if w, err = g.PutObject(ctx, bucket, key, []byte("again")); err != nil || w.PreviousToken != g.Token() {
		t.Fatalf("second PutObject: %+v, %v", w, err)
	}

	_, err = g.PutObject(ctx, bucket, staleKey, []byte("late"))
	var stale *StaleTokenError
	if !errors.As(err, &stale) || !errors.Is(err, ErrStaleToken) {
		t.Fatalf("PutObject over a newer holder's object: %v, want a *StaleTokenError", err)
	}
	if stale.Token != g.Token() || stale.Highest <= g.Token() || stale.Key != staleKey {
		t.Fatalf("stale: %+v, want token %d below highest, key %q", stale, g.Token(), staleKey)
	}

	if err := g.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := g.PutObject(ctx, bucket, key, []byte("released")); err != ErrReleased {
		t.Fatalf("PutObject after Release: %v, want ErrReleased", err)
	}
}
