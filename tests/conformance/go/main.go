// The Go conformance driver: the protocol of the agent's black-box conformance suite
// (tests/conformance/), through the Go client's public API only.
//
//	palisade-conformance-go --lease NAME [--namespace NS] [--duration-seconds N] [--keepalive-ms N] [--grants N]
//
// The agent is at PALISADE_AGENT_SOCKET. stdout: `granted <token> <claim UID> <slot>
// <fence key>`, then `write <token>` every 100 ms; on a loss `lost <reason>` (the
// agent's word, the session's end, or the grant's local deadline passing while the
// agent is silent), one more `write <token>` (the write in flight, which the fence must refuse) and exit 3; on a
// `release` line, stdin EOF or SIGTERM the grant is released, `released`, exit 0.
// With --grants N (default 1), a `release` line before the N-th grant releases, says
// `released` and acquires the same Lease again, in the same session (a long-running
// service's next acquire); stdin EOF and SIGTERM still release and exit 0 at once.
// Diagnostics on stderr; exit 1 when no grant could be had, 2 on bad arguments.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	palisade "github.com/palisade-dev/palisade/clients/go"
)

const usage = "usage: palisade-conformance-go --lease NAME [--namespace NS] [--duration-seconds N] [--keepalive-ms N] [--grants N]"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// holder is one run of the driver: its session, its Lease, and where the requests
// to quit come from.
type holder struct {
	session *palisade.Session
	lease   string
	options palisade.AcquireOptions
	// A `release` line, stdin EOF or SIGTERM, by name.
	quit   chan string
	stdout io.Writer
	stderr io.Writer
}

// say prints a line; stdout is unbuffered, so each goes out as it is printed.
func (h *holder) say(format string, args ...any) { fmt.Fprintf(h.stdout, format+"\n", args...) }

// run is the driver, returning its exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("palisade-conformance-go", flag.ContinueOnError)
	flags.SetOutput(stderr)
	lease := flags.String("lease", "", "the Lease to acquire (required)")
	namespace := flags.String("namespace", "", "the Lease's namespace (default: the agent's)")
	durationSeconds := flags.Int("duration-seconds", 0, "leaseDurationSeconds when the agent creates the Lease")
	keepaliveMs := flags.Int("keepalive-ms", 0, "the session's keepalive in milliseconds")
	grants := flags.Int("grants", 1, "grants to make: a `release` line before the last acquires the Lease again")
	if err := flags.Parse(args); err != nil || *lease == "" || *grants < 1 || flags.NArg() > 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}

	// SIGTERM, a `release` line and stdin EOF all mean: release (and, but for a
	// `release` line before the last grant, exit).
	quit := make(chan string, 2)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() { <-sigs; quit <- "SIGTERM" }()
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "release" {
				quit <- "release"
			}
		}
		quit <- "stdin EOF"
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	session, err := palisade.NewSession(ctx, palisade.SessionOptions{
		Keepalive: time.Duration(*keepaliveMs) * time.Millisecond,
		Name:      "conformance-go",
	})
	if err != nil {
		fmt.Fprintln(stderr, "session:", err)
		return 1
	}
	h := &holder{
		session: session,
		lease:   *lease,
		options: palisade.AcquireOptions{
			Namespace: *namespace,
			Duration:  time.Duration(*durationSeconds) * time.Second,
		},
		quit:   quit,
		stdout: stdout,
		stderr: stderr,
	}
	for n := 1; ; n++ {
		again, code := h.grant(ctx, n < *grants)
		if !again {
			return code
		}
	}
}

// grant acquires the Lease, holds it until asked to quit or told it is lost, and
// releases it. again: the Lease is to be acquired once more (a `release` line while
// more may follow); otherwise the driver's exit status.
func (h *holder) grant(ctx context.Context, more bool) (again bool, code int) {
	// Acquire, waiting as long as it takes; asked to quit meanwhile, give up the wait.
	type result struct {
		g   *palisade.Grant
		err error
	}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	acquired := make(chan result, 1)
	go func() {
		g, err := h.session.Acquire(actx, h.lease, &h.options)
		acquired <- result{g, err}
	}()
	var grant *palisade.Grant
	select {
	case r := <-acquired:
		if r.err != nil {
			fmt.Fprintln(h.stderr, "acquire:", r.err)
			return false, 1
		}
		grant = r.g
	case why := <-h.quit:
		fmt.Fprintf(h.stderr, "%s before the grant: the wait is given up\n", why)
		acancel()
		<-acquired
		h.session.Close(context.Background())
		h.say("released")
		return false, 0
	}

	token := grant.Token()
	// The claim's UID, slot and fence key too: the chaos suite's checker knows grants
	// by the UID, and its stores key a semaphore's slots apart.
	h.say("granted %d %s %d %s", token, grant.ClaimUID(), grant.Slot(), grant.FenceKey())
	lost := func(err error) (bool, int) {
		var reason palisade.LostReason
		if le := (*palisade.LostError)(nil); errors.As(err, &le) {
			reason = le.Reason
		}
		h.say("lost %s", reason)
		h.say("write %d", token)
		fmt.Fprintln(h.stderr, err)
		return false, 3
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			// No validity check first: the suite's fence judges the write.
			h.say("write %d", token)
		case <-grant.Lost():
			return lost(grant.Err())
		case why := <-h.quit:
			fmt.Fprintf(h.stderr, "%s: releasing\n", why)
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := grant.Release(rctx)
			rcancel()
			// A grant lost before the release: its *LostError says why.
			if errors.Is(err, palisade.ErrLost) {
				return lost(err)
			}
			if err != nil {
				fmt.Fprintln(h.stderr, "release:", err)
				return false, 1
			}
			again := more && why == "release"
			if !again {
				h.session.Close(context.Background())
			}
			h.say("released")
			return again, 0
		}
	}
}
