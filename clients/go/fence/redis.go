// Package fence holds what a Go program needs to fence its writes in Redis with a
// palisade fencing token: the shipped script (src/fence/redis.lua of the palisade
// repository, the same the Rust library and `palisade fence` send) and its key
// names. It needs no Redis client: EVAL Script with the client you use.
//
//	EVAL Script 2 MarkKey(key) DataKey(key, "journal") <token> <key> rpush <value>
//
// Create each key's mark once, when setting the key up, with
// SET MarkKey(key) "" NX (or `palisade fence --store URL --create --key KEY`): the
// script refuses (NOMARK, NoMarkError in words) a key whose mark is missing, and
// refuses (STALE) a token lower than the highest it admitted. Never create the mark
// on a writer's every start: a mark that Redis lost (FLUSHDB, eviction, a restart
// without AOF) would be created again, empty, and the next stale token admitted.
// CheckSettings, once at start, refuses a server set up to lose or roll back marks.
package fence

import _ "embed"

// RedisScript is the fencing script. go:embed reaches no file outside this module,
// so this directory holds a copy; a test fails when it differs from the original.
//
//go:embed redis.lua
var RedisScript string

// MarkKey is the Redis key of key's mark (its highest admitted token):
// palisade:{key}:token.
func MarkKey(key string) string { return "palisade:{" + key + "}:token" }

// DataKey is a key for data fenced by key's mark: palisade:{key}:data:<name>, in the
// same hash slot (Redis Cluster runs a script only on keys of one slot).
func DataKey(key, name string) string { return "palisade:{" + key + "}:data:" + name }

// Error replies of the script, as the first word of the error.
const (
	ErrStale  = "STALE"  // the token is lower than the highest admitted: nothing was written
	ErrNoMark = "NOMARK" // the key's mark is missing: nothing was written
)
