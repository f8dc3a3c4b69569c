package fence

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// configOf answers CONFIG GET from settings, as Redis does: name to value, nothing
// for a name it does not know.
func configOf(settings map[string]string) ConfigGet {
	return func(_ context.Context, name string) (map[string]string, error) {
		if v, ok := settings[name]; ok {
			return map[string]string{name: v}, nil
		}
		return map[string]string{}, nil
	}
}

// replyError is an error reply of the server, shaped as go-redis's.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestCheckSettingsNamesTheUnsafeSettings(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		what     string
		settings map[string]string
		want     []UnsafeSetting
	}{
		{"Redis' defaults", map[string]string{"appendonly": "no", "appendfsync": "everysec", "maxmemory-policy": "noeviction"},
			[]UnsafeSetting{{"appendonly", "no", "yes"}, {"appendfsync", "everysec", "always"}}},
		{"an evicting policy", map[string]string{"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "allkeys-lru"},
			[]UnsafeSetting{{"appendfsync", "everysec", "always"}, {"maxmemory-policy", "allkeys-lru", "noeviction or a volatile-* policy"}}},
	}
	for _, c := range cases {
		why, err := CheckSettings(ctx, configOf(c.settings))
		var unsafe *UnsafeSettingsError
		if !errors.As(err, &unsafe) || !reflect.DeepEqual(unsafe.Settings, c.want) {
			t.Errorf("%s: %q, %v; want %v", c.what, why, err, c.want)
		}
	}
	_, err := CheckSettings(ctx, configOf(cases[0].settings))
	for _, part := range []string{`Redis is not set up for fencing: appendonly is "no" (needs yes), appendfsync is "everysec" (needs always);`,
		"a rolled-back mark admits stale tokens"} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("message %v, want it to say %q", err, part)
		}
	}
}

func TestCheckSettingsPassesTheSafeOnes(t *testing.T) {
	for _, policy := range []string{"noeviction", "volatile-lru", "VOLATILE-TTL"} {
		why, err := CheckSettings(context.Background(), configOf(map[string]string{
			"appendonly": "Yes", "appendfsync": "always", "maxmemory-policy": policy}))
		if why != "" || err != nil {
			t.Errorf("%s: %q, %v; want safe", policy, why, err)
		}
	}
}

func TestCheckSettingsCannotSeeWhereConfigIsRefused(t *testing.T) {
	ctx := context.Background()
	acl := func(context.Context, string) (map[string]string, error) {
		return nil, replyError("NOPERM User fencer has no permissions to run the 'config|get' command")
	}
	why, err := CheckSettings(ctx, acl)
	if err != nil || !strings.Contains(why, "CONFIG GET was refused") || !strings.Contains(why, "no permissions") {
		t.Errorf("an ACL without CONFIG: %q, %v; want cannot see", why, err)
	}
	wrapped := func(context.Context, string) (map[string]string, error) {
		return nil, errors.Join(ErrRefused, errors.New("ERR unknown command 'CONFIG'"))
	}
	if why, err := CheckSettings(ctx, wrapped); err != nil || why == "" {
		t.Errorf("a refusal marked ErrRefused: %q, %v; want cannot see", why, err)
	}
	missing := configOf(map[string]string{"appendonly": "yes"})
	if why, err := CheckSettings(ctx, missing); err != nil || why != "CONFIG GET did not show appendfsync, maxmemory-policy" {
		t.Errorf("settings missing from the answer: %q, %v", why, err)
	}
	// An unsafe setting it sees is refused even when it cannot see the others.
	if _, err := CheckSettings(ctx, configOf(map[string]string{"appendonly": "no"})); err == nil {
		t.Error("appendonly no, the rest unseen: no error")
	}
}

func TestCheckSettingsReturnsConnectionErrors(t *testing.T) {
	down := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	_, err := CheckSettings(context.Background(), func(context.Context, string) (map[string]string, error) { return nil, down })
	if !errors.Is(err, down) {
		t.Errorf("error %v, want the connection's", err)
	}
}

func TestNoMarkErrorSaysHowToCreateTheMark(t *testing.T) {
	msg := (&NoMarkError{Key: "billing"}).Error()
	for _, part := range []string{`key "billing"`, "palisade:{billing}:token is missing", `SET palisade:{billing}:token "" NX`,
		"palisade fence --store URL --create --key KEY", "Redis lost it", "refuses to start over"} {
		if !strings.Contains(msg, part) {
			t.Errorf("%q does not say %q", msg, part)
		}
	}
}
