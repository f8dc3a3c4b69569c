package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/palisade-dev/palisade/clients/go/fence"
	"github.com/redis/go-redis/v9"
)

// fakeRedis speaks enough RESP2 for fenceReady: CONFIG GET from config, EXISTS and
// SET on keys; it records every command.
type fakeRedis struct {
	mu       sync.Mutex
	config   map[string]string
	keys     map[string]string
	commands []string
}

func startFakeRedis(t *testing.T, config map[string]string) (*fakeRedis, *redis.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{config: config, keys: map[string]string{}}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(conn)
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close(); ln.Close() })
	return f, rdb
}

func (f *fakeRedis) serve(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.commands = append(f.commands, strings.Join(args, " "))
		reply := f.answer(args)
		f.mu.Unlock()
		if _, err := conn.Write([]byte(reply)); err != nil {
			return
		}
	}
}

func (f *fakeRedis) answer(args []string) string {
	cmd := strings.ToUpper(args[0])
	switch {
	case cmd == "CONFIG" && len(args) == 3 && strings.EqualFold(args[1], "GET"):
		v, ok := f.config[args[2]]
		if !ok {
			return "*0\r\n"
		}
		return fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(args[2]), args[2], len(v), v)
	case cmd == "EXISTS" && len(args) == 2:
		if _, ok := f.keys[args[1]]; ok {
			return ":1\r\n"
		}
		return ":0\r\n"
	case cmd == "SET" && len(args) >= 3:
		if _, ok := f.keys[args[1]]; ok && len(args) > 3 && strings.EqualFold(args[3], "NX") {
			return "$-1\r\n"
		}
		f.keys[args[1]] = args[2]
		return "+OK\r\n"
	case cmd == "PING":
		return "+PONG\r\n"
	}
	return "-ERR unknown command '" + args[0] + "'\r\n"
}

func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad command header %q", line)
	}
	args := make([]string, n)
	for i := range args {
		if line, err = r.ReadString('\n'); err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil {
			return nil, fmt.Errorf("bad bulk header %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

var safeSettings = map[string]string{"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}

// A mark Redis lost is not created again at start: the start is refused, saying why.
func TestStartRefusesAMissingMark(t *testing.T) {
	f, rdb := startFakeRedis(t, safeSettings)
	err := fenceReady(context.Background(), rdb, "ns/go-leader-redis")
	var noMark *fence.NoMarkError
	if !errors.As(err, &noMark) {
		t.Errorf("start without the mark: %v, want a NoMarkError", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if mark, ok := f.keys[fence.MarkKey("ns/go-leader-redis")]; ok {
		t.Errorf("the start created the mark (%q): a lost mark comes back empty and admits a stale token; commands %q", mark, f.commands)
	}
}

func TestStartWithTheMark(t *testing.T) {
	f, rdb := startFakeRedis(t, safeSettings)
	f.keys[fence.MarkKey("ns/go-leader-redis")] = "200"
	if err := fenceReady(context.Background(), rdb, "ns/go-leader-redis"); err != nil {
		t.Fatalf("start with the mark: %v", err)
	}
	if got := f.keys[fence.MarkKey("ns/go-leader-redis")]; got != "200" {
		t.Fatalf("the mark is %q, want it untouched", got)
	}
}

func TestStartRefusesUnsafeSettings(t *testing.T) {
	f, rdb := startFakeRedis(t, map[string]string{"appendonly": "no", "appendfsync": "everysec", "maxmemory-policy": "noeviction"})
	f.keys[fence.MarkKey("ns/go-leader-redis")] = "200"
	err := fenceReady(context.Background(), rdb, "ns/go-leader-redis")
	var unsafe *fence.UnsafeSettingsError
	if !errors.As(err, &unsafe) || !strings.Contains(err.Error(), `appendonly is "no" (needs yes)`) {
		t.Fatalf("start on Redis' default persistence: %v, want the unsafe settings named", err)
	}
}
