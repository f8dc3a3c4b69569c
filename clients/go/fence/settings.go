package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ConfigGet runs CONFIG GET name on the server and returns its answer, name to value.
// With go-redis:
//
//	func(ctx context.Context, name string) (map[string]string, error) {
//		return rdb.ConfigGet(ctx, name).Result()
//	}
//
// An error reply of the server (CONFIG refused: an ACL without it, a managed service)
// must be told from a connection error: it has a RedisError method (go-redis's error
// replies do) or wraps ErrRefused.
type ConfigGet func(ctx context.Context, name string) (map[string]string, error)

// ErrRefused marks an error reply of the server to CONFIG GET, for clients whose
// errors have no RedisError method.
var ErrRefused = errors.New("refused by the server")

// UnsafeSetting is a server setting that lets Redis lose or roll back marks.
type UnsafeSetting struct {
	Name     string
	Value    string
	Required string // what the fence needs instead
}

func (u UnsafeSetting) String() string {
	return fmt.Sprintf("%s is %q (needs %s)", u.Name, u.Value, u.Required)
}

// UnsafeSettingsError is CheckSettings' refusal: each unsafe setting it saw.
type UnsafeSettingsError struct {
	Settings []UnsafeSetting
}

func (e *UnsafeSettingsError) Error() string {
	parts := make([]string, len(e.Settings))
	for i, u := range e.Settings {
		parts[i] = u.String()
	}
	return "Redis is not set up for fencing: " + strings.Join(parts, ", ") +
		"; it can lose or roll back marks, and a rolled-back mark admits stale tokens"
}

// CheckSettings reads the settings the fence needs with CONFIG GET:
// appendonly yes (without AOF a restart loses or rolls back marks), appendfsync
// always (else a crash forgets the last raised marks), and maxmemory-policy
// noeviction or a volatile-* policy (an allkeys-* policy evicts idle marks; marks
// have no TTL). It returns an *UnsafeSettingsError naming each unsafe one; where
// the server will not show them (CONFIG refused, or a setting missing from the
// answer) it returns why in cannotSee and no error: make sure of them another way.
// Other errors are configGet's.
//
// The script does not check them (that would cost a round trip per write): call
// CheckSettings once when the program starts, as the Rust library's create and
// `palisade fence` do. On Redis Cluster it sees the one node configGet asks.
func CheckSettings(ctx context.Context, configGet ConfigGet) (cannotSee string, err error) {
	names := []string{"appendonly", "appendfsync", "maxmemory-policy"}
	answers := make([]map[string]string, len(names))
	// One name per CONFIG GET: Redis before 7 takes one pattern only.
	for i, name := range names {
		answers[i], err = configGet(ctx, name)
		if err != nil {
			var reply interface{ RedisError() }
			if errors.Is(err, ErrRefused) || errors.As(err, &reply) {
				return "CONFIG GET was refused: " + err.Error(), nil
			}
			return "", err
		}
	}
	var unsafe []UnsafeSetting
	var unseen []string
	for i, name := range names {
		value, ok := lookup(answers[i], name)
		if !ok {
			unseen = append(unseen, name)
			continue
		}
		value = strings.ToLower(value)
		var safe bool
		var required string
		switch name {
		case "appendonly":
			safe, required = value == "yes", "yes"
		case "appendfsync":
			safe, required = value == "always", "always"
		default:
			safe = value == "noeviction" || strings.HasPrefix(value, "volatile-")
			required = "noeviction or a volatile-* policy"
		}
		if !safe {
			unsafe = append(unsafe, UnsafeSetting{Name: name, Value: value, Required: required})
		}
	}
	if len(unsafe) > 0 {
		return "", &UnsafeSettingsError{Settings: unsafe}
	}
	if len(unseen) > 0 {
		return "CONFIG GET did not show " + strings.Join(unseen, ", "), nil
	}
	return "", nil
}

// lookup finds name in a CONFIG GET answer, whatever its case.
func lookup(answer map[string]string, name string) (string, bool) {
	if v, ok := answer[name]; ok {
		return v, true
	}
	for k, v := range answer {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// NoMarkError is the script's NOMARK refusal in words: the key's mark is missing, and
// nothing was written.
type NoMarkError struct {
	Key string
}

func (e *NoMarkError) Error() string {
	mark := MarkKey(e.Key)
	return fmt.Sprintf("fencing refused for key %q: its mark %s is missing. Either it was never "+
		"created (create it once, when the key is set up: SET %s \"\" NX, or palisade fence "+
		"--store URL --create --key KEY), or Redis lost it (FLUSHDB, eviction, a restart without "+
		"AOF, a failover to an empty replica); the fence refuses to start over, as that would "+
		"admit any stale token", e.Key, mark, mark)
}
