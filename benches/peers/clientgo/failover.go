// The failover mode: how long client-go leader election leaves a role unowned when
// the leading process dies, the peer of palisade's failover figures (the controller's,
// and a fenced operator's).
//
//	clientgo-bench failover [--kills-default 5] [--kills-tuned 20] [--out clientgo-failover.json]
//
// Two candidate processes (this binary re-executed as `clientgo-bench candidate`,
// each with its own identity and its own client) contend for one Lease in a
// namespace of their own. A leader writes a ConfigMap of its own, as an operator
// would, as soon as OnStartedLeading runs and every 50 ms after. The driver SIGKILLs
// the leader and measures, on its own monotonic clock, from just before the kill to
// the moment it reads the standby's lines from the standby's stdout: its
// OnStartedLeading (scenario "failover") and its first accepted write (scenario
// "operator-failover", benches/operator's peer). Then it starts a replacement
// candidate, waits until that one has read the Lease once, and kills the new
// leader: one sample of each per kill. Every wait is bounded; every candidate is killed when
// the driver returns, and a candidate exits by itself when the driver's end of its
// stdin closes (the driver died) or after --lifetime.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// failoverTimings are the configs of the failover figure: client-go's documented
// defaults, and the timings palisade's own leader election defaults to.
var failoverTimings = map[string]timing{
	"default": {"default", 15 * time.Second, 10 * time.Second, 2 * time.Second},
	"tuned":   {"tuned", 1 * time.Second, 750 * time.Millisecond, 250 * time.Millisecond},
}

// Lines a candidate writes on stdout, one per event, read by the driver.
const (
	lineTried   = "tried"   // its first Lease request has answered
	lineLeading = "leading" // OnStartedLeading fired (followed by the candidate's wall clock, Unix ns)
	lineWrote   = "wrote"   // its first write as leader was accepted
	lineStopped = "stopped" // OnStoppedLeading fired
)

// writeEvery is how often a leader writes its ConfigMap: an operator reconciling
// briskly (benches/operator's leaders write as often).
const writeEvery = 50 * time.Millisecond

// writeWhileLeading patches ConfigMap ns/name every writeEvery until ctx ends (the
// leadership with it), and says lineWrote at the first accepted write. client-go's
// writes carry nothing a server could fence them by: the first one is accepted.
func writeWhileLeading(ctx context.Context, cs kubernetes.Interface, ns, name, id string, say func(string)) {
	wrote := false
	for seq := 1; ctx.Err() == nil; seq++ {
		patch := fmt.Sprintf(`{"data":{"leader":%q,"seq":"%d"}}`, id, seq)
		_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err == nil && !wrote {
			wrote = true
			say(lineWrote)
		} else if err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "%s: write %d: %v\n", id, seq, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(writeEvery):
		}
	}
}

// runCandidate is one contender: client-go leader election on a LeaseLock until it
// loses the lease, its stdin closes or --lifetime passes.
func runCandidate(argv []string) {
	fs := flag.NewFlagSet("candidate", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig (default: $KUBECONFIG)")
	ns := fs.String("namespace", "", "namespace of the Lease")
	lease := fs.String("lease", "", "Lease name")
	id := fs.String("id", "", "this candidate's identity")
	ld := fs.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	rd := fs.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	rp := fs.Duration("retry-period", 2*time.Second, "RetryPeriod")
	lifetime := fs.Duration("lifetime", 30*time.Minute, "exit after this long whatever happens")
	configMap := fs.String("write-configmap", "", "ConfigMap (in --namespace) to write while leading; none if empty")
	_ = fs.Parse(argv)
	klog.SetLogger(logr.Discard())
	if *kubeconfig == "" || *ns == "" || *lease == "" || *id == "" {
		fmt.Fprintln(os.Stderr, "candidate: --kubeconfig (or $KUBECONFIG), --namespace, --lease and --id are required")
		os.Exit(2)
	}
	var mu sync.Mutex // one line at a time on stdout
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(s)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	// The leader's writes and the election share the client's rate limiter: at the
	// default 5 QPS, 20 writes a second would hold back its renewals.
	cfg.QPS, cfg.Burst = 100, 200
	var tried atomic.Bool
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if strings.Contains(r.URL.Path, "/leases") && !tried.Swap(true) {
				say(lineTried)
			}
			return resp, err
		})
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *lifetime)
	defer cancel()
	// The driver holds the write end of stdin: EOF means it is gone.
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: *ns, Name: *lease},
			Client:     cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: *id},
		},
		LeaseDuration: *ld,
		RenewDeadline: *rd,
		RetryPeriod:   *rp,
		Name:          *lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				say(lineLeading + " " + strconv.FormatInt(time.Now().UnixNano(), 10))
				if *configMap != "" {
					writeWhileLeading(ctx, cs, *ns, *configMap, *id, say)
				}
			},
			OnStoppedLeading: func() { say(lineStopped) },
		},
	})
	if err != nil {
		fatal(err)
	}
	le.Run(ctx)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// proc is a candidate process seen from the driver. Each channel is closed once,
// when the event's line arrives (or the process exits).
type proc struct {
	id        string
	cmd       *exec.Cmd
	stdin     io.Closer
	tried     chan struct{}
	leading   chan struct{}
	leadingAt time.Time // the driver's receive time of the leading line; set before leading closes
	wrote     chan struct{}
	wroteAt   time.Time // the driver's receive time of the wrote line; set before wrote closes
	exited    chan struct{}
}

type fleet struct {
	bin, kubeconfig, ns, lease, configMap string
	t                                     timing
	mu                                    sync.Mutex
	procs                                 []*proc
}

func (f *fleet) spawn(id string) (*proc, error) {
	cmd := exec.Command(f.bin, "candidate", "--kubeconfig", f.kubeconfig, "--namespace", f.ns, "--lease", f.lease,
		"--id", id, "--lease-duration", f.t.LeaseDuration.String(), "--renew-deadline", f.t.RenewDeadline.String(),
		"--retry-period", f.t.RetryPeriod.String(), "--write-configmap", f.configMap)
	cmd.Stderr = os.Stderr
	// Killed with the driver's thread too (Linux), besides the stdin EOF.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start candidate %s: %w", id, err)
	}
	p := &proc{id: id, cmd: cmd, stdin: stdin, tried: make(chan struct{}), leading: make(chan struct{}),
		wrote: make(chan struct{}), exited: make(chan struct{})}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	go func() {
		var triedOnce, leadOnce, wroteOnce sync.Once
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			now := time.Now() // monotonic: compared with the driver's kill instant only
			switch strings.Fields(sc.Text() + " ")[0] {
			case lineTried:
				triedOnce.Do(func() { close(p.tried) })
			case lineLeading:
				leadOnce.Do(func() { p.leadingAt = now; close(p.leading) })
			case lineWrote:
				wroteOnce.Do(func() { p.wroteAt = now; close(p.wrote) })
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// kill SIGKILLs p (if still running) and waits, bounded, until it is reaped.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(os.Stderr, "candidate %s (pid %d) not reaped 10 s after SIGKILL\n", p.id, p.cmd.Process.Pid)
	}
}

func (f *fleet) killAll() {
	f.mu.Lock()
	procs := f.procs
	f.procs = nil
	f.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
}

func wait(ctx context.Context, ch <-chan struct{}, limit time.Duration, what string) error {
	select {
	case <-ch:
		return nil
	case <-time.After(limit):
		return fmt.Errorf("timed out after %v waiting for %s", limit, what)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}

// failoverSamples kills the leader `kills` times and returns each failover time (ms):
// to the standby's OnStartedLeading (out) and to its first accepted write (writes),
// plus the kills discarded because the standby took over before the kill (the
// leader's renewal failed on its own on the loaded machine).
func (f *fleet) failoverSamples(ctx context.Context, kills int, verbose bool) (out, writes []float64, discarded int, err error) {
	defer f.killAll()
	limit := 2*f.t.LeaseDuration + 4*f.t.RetryPeriod + 15*time.Second
	n := 0
	next := func() (*proc, error) {
		p, err := f.spawn(fmt.Sprintf("failover-%s-cand-%03d", f.t.Name, n))
		n++
		return p, err
	}
	a, err := next()
	if err != nil {
		return nil, nil, 0, err
	}
	b, err := next()
	if err != nil {
		return nil, nil, 0, err
	}
	var leader, standby *proc
	select {
	case <-a.leading:
		leader, standby = a, b
	case <-b.leading:
		leader, standby = b, a
	case <-time.After(limit):
		return nil, nil, 0, fmt.Errorf("neither first candidate led within %v", limit)
	case <-ctx.Done():
		return nil, nil, 0, ctx.Err()
	}
	for len(out) < kills {
		if discarded > kills { // bounded: every round either samples or is discarded
			return out, writes, discarded, fmt.Errorf("%d rounds in which the leader lost the lease before the kill", discarded)
		}
		if err = wait(ctx, standby.tried, limit, standby.id+" to read the Lease"); err != nil {
			return
		}
		// A random phase against the standby's retry and the leader's renew timers.
		if err = sleepCtx(ctx, time.Duration(rand.Int64N(int64(float64(f.t.RetryPeriod)*2.2)+1))); err != nil {
			return
		}
		lost := false
		select {
		case <-standby.leading:
			lost = true
		case <-leader.exited:
			lost = true
		default:
		}
		if lost {
			// The leader lost the lease (or died) by itself: not a failover after a kill.
			discarded++
			if err = wait(ctx, standby.leading, limit, standby.id+" to lead after "+leader.id+" lost the lease"); err != nil {
				return
			}
			leader.kill()
			leader = standby
			if standby, err = next(); err != nil {
				return
			}
			continue
		}
		t0 := time.Now()
		if err = leader.cmd.Process.Kill(); err != nil {
			return out, writes, discarded, fmt.Errorf("SIGKILL %s: %w", leader.id, err)
		}
		if err = wait(ctx, standby.leading, limit, standby.id+" to lead after "+leader.id+" was killed"); err != nil {
			return
		}
		if err = wait(ctx, standby.wrote, limit, standby.id+" to write after "+leader.id+" was killed"); err != nil {
			return
		}
		d := standby.leadingAt.Sub(t0)
		if d < 0 { // it led between the check above and the kill: not caused by the kill
			discarded++
		} else {
			out = append(out, ms(d))
			writes = append(writes, ms(standby.wroteAt.Sub(t0)))
		}
		if verbose {
			fmt.Fprintf(os.Stderr, "  [failover %s] kill %d/%d: %s -> %s led in %.1f ms, wrote in %.1f ms\n",
				f.t.Name, len(out), kills, leader.id, standby.id, ms(d), ms(standby.wroteAt.Sub(t0)))
		}
		leader.kill() // reap it
		leader = standby
		if standby, err = next(); err != nil {
			return
		}
	}
	return
}

// runFailover is the failover mode's driver.
func runFailover(argv []string) {
	fs := flag.NewFlagSet("failover", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig (default: $KUBECONFIG)")
	killsDefault := fs.Int("kills-default", 5, "leader kills with the default timings (15s/10s/2s; ~16 s each)")
	killsTuned := fs.Int("kills-tuned", 20, "leader kills with the tuned timings (1s/750ms/250ms)")
	out := fs.String("out", "clientgo-failover.json", "JSON output file")
	timeout := fs.Duration("timeout", 10*time.Minute, "overall timeout")
	verbose := fs.Bool("v", false, "print every kill")
	_ = fs.Parse(argv)
	klog.SetLogger(logr.Discard())
	for name, k := range map[string]int{"kills-default": *killsDefault, "kills-tuned": *killsTuned} {
		if k < 0 || k > 1000 {
			fmt.Fprintf(os.Stderr, "--%s out of range (0..1000)\n", name)
			os.Exit(2)
		}
	}
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "no kubeconfig: pass --kubeconfig PATH or set KUBECONFIG (make bench-clientgo passes target/cluster/kubeconfig)")
		os.Exit(2)
	}
	bin, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	base, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fatal(err)
	}
	admin, err := kubernetes.NewForConfig(base)
	if err != nil {
		fatal(err)
	}
	ns := fmt.Sprintf("bench-clientgo-failover-%d", os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	o := output{Source: "clientgo-failover", Latency: []latency{}, Figures: []figure{},
		Versions:   map[string]string{"client-go": clientGoVersion(), "go": runtime.Version()},
		Parameters: map[string]string{"kills_default": strconv.Itoa(*killsDefault), "kills_tuned": strconv.Itoa(*killsTuned), "namespace": ns}}
	if v, err := admin.Discovery().ServerVersion(); err == nil {
		o.Versions["kubernetes"] = v.GitVersion
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		fatal(err)
	}
	cleanup := func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		if err := admin.CoreV1().Namespaces().Delete(cctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintln(os.Stderr, "namespace cleanup:", err)
		}
	}

	started := time.Now()
	var errs []error
	for _, c := range []struct {
		t     timing
		kills int
	}{{failoverTimings["tuned"], *killsTuned}, {failoverTimings["default"], *killsDefault}} {
		t := c.t
		timingNote := fmt.Sprintf("LeaseDuration %v, RenewDeadline %v, RetryPeriod %v", t.LeaseDuration, t.RenewDeadline, t.RetryPeriod)
		if c.kills == 0 {
			skipped := fmt.Sprintf("not run (--kills-%s 0); %s", t.Name, timingNote)
			o.Latency = append(o.Latency, summarize(t.Name, "failover", nil, skipped),
				summarize(t.Name, "operator-failover", nil, skipped))
			continue
		}
		fmt.Fprintf(os.Stderr, "client-go failover %s (%s): %d kills\n", t.Name, timingNote, c.kills)
		f := &fleet{bin: bin, kubeconfig: *kubeconfig, ns: ns, lease: "failover-" + t.Name, configMap: "failover-" + t.Name + "-state", t: t}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: f.configMap}, Data: map[string]string{"seq": "0"}}
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("failover %s: ConfigMap %s: %w", t.Name, f.configMap, err))
			break
		}
		s, writes, discarded, err := f.failoverSamples(ctx, c.kills, *verbose)
		how := fmt.Sprintf("as the driver reads the standby's stdout (the driver's monotonic clock); no lock grant involved: "+
			"client-go candidates take the Lease themselves once the record they saw stops changing for LeaseDuration. "+
			"Two candidate processes (own identity, own client) on one Lease, the leader writing a ConfigMap of its own "+
			"from OnStartedLeading on, every %v; after each kill a replacement candidate starts and reads the Lease once "+
			"before the next kill, at a random phase (0..2.2 RetryPeriods); %s", writeEvery, timingNote)
		note := "SIGKILL of the leading candidate process -> the standby's OnStartedLeading, " + how
		writeNote := "SIGKILL of the leading candidate process -> the standby's first accepted write (a merge patch of its " +
			"ConfigMap, sent as OnStartedLeading runs; unfenced, so the first one is accepted), " + how
		var tail string
		if discarded > 0 {
			tail += fmt.Sprintf("; %d round(s) discarded: the leader lost the lease before the kill (its renewals failed on the loaded machine)", discarded)
		}
		if err != nil {
			tail += "; RUN FAILED: " + err.Error()
			errs = append(errs, fmt.Errorf("failover %s: %w", t.Name, err))
		}
		note, writeNote = note+tail, writeNote+tail
		if len(s) == 0 && err != nil {
			note, writeNote = "no sample: "+note, "no sample: "+writeNote
		}
		led := summarize(t.Name, "failover", s, note)
		o.Latency = append(o.Latency, led, summarize(t.Name, "operator-failover", writes, writeNote))
		if len(s) > 0 {
			leading := "from the kill to the standby's OnStartedLeading (the failover row), the same kills"
			o.Figures = append(o.Figures,
				figure{System: "client-go", Config: t.Name, Name: "operator_failover_to_leading_p50", Value: led.P50, Unit: "ms", Note: leading},
				figure{System: "client-go", Config: t.Name, Name: "operator_failover_to_leading_p99", Value: led.P99, Unit: "ms", Note: leading})
		}
		if err != nil && ctx.Err() != nil {
			break
		}
	}
	o.Parameters["wall_seconds"] = strconv.Itoa(int(time.Since(started).Seconds()))
	cleanup() // the candidates are gone: failoverSamples killed them
	if err := writeJSON(*out, o); err != nil {
		fmt.Fprintln(os.Stderr, "write:", err)
		errs = append(errs, err)
	}
	printTable(o)
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "ERROR:", err)
		os.Exit(1)
	}
}
