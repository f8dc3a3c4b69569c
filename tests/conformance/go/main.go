// The Go conformance driver: the protocol of the agent's black-box conformance suite
// (tests/conformance/), through the Go client's public API only.
//
//	palisade-conformance-go --lease NAME [--namespace NS] [--duration-seconds N] [--keepalive-ms N]
//
// The agent is at PALISADE_AGENT_SOCKET. stdout: `granted <token>`, then `write
// <token>` every 100 ms; on a loss `lost <reason>` (the agent's word, the session's
// end, or the grant's local deadline passing while the agent is silent), one more
// `write <token>` (the write in flight, which the fence must refuse) and exit 3; on a
// `release` line, stdin EOF or SIGTERM the grant is released, `released`, exit 0.
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

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the driver, returning its exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("palisade-conformance-go", flag.ContinueOnError)
	flags.SetOutput(stderr)
	lease := flags.String("lease", "", "the Lease to acquire (required)")
	namespace := flags.String("namespace", "", "the Lease's namespace (default: the agent's)")
	durationSeconds := flags.Int("duration-seconds", 0, "leaseDurationSeconds when the agent creates the Lease")
	keepaliveMs := flags.Int("keepalive-ms", 0, "the session's keepalive in milliseconds")
	if err := flags.Parse(args); err != nil || *lease == "" || flags.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: palisade-conformance-go --lease NAME [--namespace NS] [--duration-seconds N] [--keepalive-ms N]")
		return 2
	}
	// Unbuffered: each line goes out as it is printed.
	say := func(format string, args ...any) { fmt.Fprintf(stdout, format+"\n", args...) }

	// SIGTERM, a `release` line and stdin EOF all mean: release and exit.
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
				return
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

	// Acquire, waiting as long as it takes; asked to quit meanwhile, give up the wait.
	type result struct {
		g   *palisade.Grant
		err error
	}
	acquired := make(chan result, 1)
	go func() {
		g, err := session.Acquire(ctx, *lease, &palisade.AcquireOptions{
			Namespace: *namespace,
			Duration:  time.Duration(*durationSeconds) * time.Second,
		})
		acquired <- result{g, err}
	}()
	var grant *palisade.Grant
	select {
	case r := <-acquired:
		if r.err != nil {
			fmt.Fprintln(stderr, "acquire:", r.err)
			return 1
		}
		grant = r.g
	case why := <-quit:
		fmt.Fprintf(stderr, "%s before the grant: the wait is given up\n", why)
		cancel()
		<-acquired
		session.Close(context.Background())
		say("released")
		return 0
	}

	token := grant.Token()
	// The claim's UID too: the chaos suite's checker knows grants by it.
	say("granted %d %s", token, grant.ClaimUID())
	lost := func(err error) int {
		var reason palisade.LostReason
		if le := (*palisade.LostError)(nil); errors.As(err, &le) {
			reason = le.Reason
		}
		say("lost %s", reason)
		say("write %d", token)
		fmt.Fprintln(stderr, err)
		return 3
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			// No validity check first: the suite's fence judges the write.
			say("write %d", token)
		case <-grant.Lost():
			return lost(grant.Err())
		case why := <-quit:
			fmt.Fprintf(stderr, "%s: releasing\n", why)
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := grant.Release(rctx)
			rcancel()
			// A grant lost before the release: its *LostError says why.
			if errors.Is(err, palisade.ErrLost) {
				return lost(err)
			}
			if err != nil {
				fmt.Fprintln(stderr, "release:", err)
				return 1
			}
			session.Close(context.Background())
			say("released")
			return 0
		}
	}
}
