package fence

import (
	"os"
	"testing"
)

// The embedded script is a copy: it must be the repository's, byte for byte.
func TestRedisScriptIsTheShippedOne(t *testing.T) {
	want, err := os.ReadFile("../../../src/fence/redis.lua")
	if err != nil {
		t.Fatalf("reading the original script: %v", err)
	}
	if RedisScript != string(want) {
		t.Fatal("fence/redis.lua differs from src/fence/redis.lua: copy it again (cp src/fence/redis.lua clients/go/fence/redis.lua)")
	}
}

func TestKeysShareTheHashTag(t *testing.T) {
	if got := MarkKey("billing"); got != "palisade:{billing}:token" {
		t.Errorf("MarkKey = %q", got)
	}
	if got := DataKey("billing", "journal"); got != "palisade:{billing}:data:journal" {
		t.Errorf("DataKey = %q", got)
	}
}
