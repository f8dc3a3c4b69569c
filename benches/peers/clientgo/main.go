// Command clientgo-bench measures leader-election handover latency and
// steady-state API load of k8s.io/client-go/tools/leaderelection (LeaseLock)
// against a real kube-apiserver, as a peer baseline for palisade.
//
// Per timing config (default 15s/10s/2s, tuned 2s/1.5s/0.25s) it runs -rounds
// voluntary-release handovers and -rounds expiry handovers. A handover takes
// seconds (default: ~6 s a release round, ~22 s an expiry round), so the rounds
// run in lanes: independent Leases side by side, each a chain of candidates,
// ceil(rounds/lanes) handovers per lane. Then the steady-state lease request rate
// of one holder and three waiters. Writes the common result schema of
// benches/common/schema.rs (source "clientgo").
//
// `clientgo-bench failover` is the failover mode (failover.go, source
// "clientgo-failover"): SIGKILL of the leading candidate process to the standby's
// OnStartedLeading, and to its first accepted write (a fenced operator's peer).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// clientGoVersion is the version of k8s.io/client-go linked into this binary.
func clientGoVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/client-go" {
				return d.Version
			}
		}
	}
	return "unknown"
}

type timing struct {
	Name                                      string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

var timings = map[string]timing{
	"default": {"default", 15 * time.Second, 10 * time.Second, 2 * time.Second},
	"tuned":   {"tuned", 2 * time.Second, 1500 * time.Millisecond, 250 * time.Millisecond},
}

// latency, figure and output are the common result schema, defined in
// benches/common/schema.rs (Source, Latency, Figure; report.rs checks each file
// with Source::problems). Go cannot share the Rust code, so keep these
// field-for-field with it: the same JSON names and types, latencies in "ms",
// percentiles nearest-rank, a scenario from schema.rs's SCENARIOS, n = 0 with a
// note for one that does not apply, and no null where schema.rs wants a list.
type latency struct {
	System   string    `json:"system"`
	Config   string    `json:"config"`
	Scenario string    `json:"scenario"`
	Unit     string    `json:"unit"`
	N        int       `json:"n"`
	P50      float64   `json:"p50"`
	P95      float64   `json:"p95"`
	P99      float64   `json:"p99"`
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	Mean     float64   `json:"mean"`
	Samples  []float64 `json:"samples"`
	Note     string    `json:"note"`
}

type figure struct {
	System string  `json:"system"`
	Config string  `json:"config,omitempty"`
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Note   string  `json:"note"`
}

type output struct {
	Source     string            `json:"source"`
	Versions   map[string]string `json:"versions"`
	Latency    []latency         `json:"latency"`
	Figures    []figure          `json:"figures"`
	Parameters map[string]string `json:"parameters"`
}

// bench holds shared state.
type bench struct {
	base    *rest.Config
	admin   *kubernetes.Clientset
	ns      string
	clientN atomic.Int64 // lease requests issued by our candidates (client-side count)
	verbose bool
}

// newClientset builds a clientset with its own transport (own TCP/TLS
// connections): a non-nil Proxy func makes client-go's transport cache skip it.
// lastWrite gets the wall clock (Unix ns) of each Lease write as it goes out.
func (b *bench) newClientset(lastWrite *atomic.Int64) (*kubernetes.Clientset, error) {
	cfg := rest.CopyConfig(b.base)
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Timeout = 10 * time.Second
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return countingRT{rt: rt, n: &b.clientN, lastWrite: lastWrite}
	}
	return kubernetes.NewForConfig(cfg)
}

type countingRT struct {
	rt        http.RoundTripper
	n         *atomic.Int64
	lastWrite *atomic.Int64
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/leases") {
		c.n.Add(1)
		// Every bench's expiry clock starts at the silent holder's last renewal
		// send, as its client saw it: here, just before the request goes out.
		if r.Method == http.MethodPut || r.Method == http.MethodPatch || r.Method == http.MethodPost {
			c.lastWrite.Store(time.Now().UnixNano())
		}
	}
	return c.rt.RoundTrip(r)
}

type candidate struct {
	id        string
	lastWrite atomic.Int64 // Unix ns of its last Lease write's send
	le        *leaderelection.LeaderElector
	cancel    context.CancelFunc
	done      chan struct{}
	started   chan time.Time // receives time of OnStartedLeading
}

func (b *bench) startCandidate(ctx context.Context, t timing, lease, id string, releaseOnCancel bool) (*candidate, error) {
	c := &candidate{id: id, done: make(chan struct{}), started: make(chan time.Time, 1)}
	cs, err := b.newClientset(&c.lastWrite)
	if err != nil {
		return nil, err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: b.ns, Name: lease},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   t.LeaseDuration,
		RenewDeadline:   t.RenewDeadline,
		RetryPeriod:     t.RetryPeriod,
		ReleaseOnCancel: releaseOnCancel,
		Name:            lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				select {
				case c.started <- time.Now():
				default:
				}
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return nil, err
	}
	c.le = le
	cctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	go func() { defer close(c.done); le.Run(cctx) }()
	return c, nil
}

// stop cancels the candidate and waits (bounded) for its Run to return.
func (c *candidate) stop(limit time.Duration) {
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(limit):
	}
}

func waitStarted(ctx context.Context, c *candidate, limit time.Duration) (time.Time, error) {
	select {
	case t := <-c.started:
		return t, nil
	case <-time.After(limit):
		return time.Time{}, fmt.Errorf("%s did not become leader within %v", c.id, limit)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// waitObserves waits until candidate c has polled the lease and observed holder.
func waitObserves(ctx context.Context, c *candidate, holder string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if c.le.GetLeader() == holder {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not observe holder %s within %v", c.id, holder, limit)
}

func jitterSleep(ctx context.Context, max time.Duration) error {
	d := time.Duration(rand.Int64N(int64(max) + 1))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// samples are one lane's (or all lanes') handover latencies, ms.
type samples struct {
	raw       []float64 // t0 (holder let go) -> the next OnStartedLeading
	pastLD    []float64 // expiry: raw - LeaseDuration
	pastRenew []float64 // expiry: next OnStartedLeading - (last renewal's send + LeaseDuration)
}

// runLanes runs n handovers as `lanes` independent chains side by side, each on a
// Lease of its own, ceil(n/lanes) rounds each. Expiry lanes start staggered over
// the lease duration (lane l, l/lanes of it late), as every bench's are, so that
// they do not come due in step.
func (b *bench) runLanes(ctx context.Context, t timing, expiry bool, n, lanes int) (samples, error) {
	if lanes < 1 {
		lanes = 1
	}
	perLane := (n + lanes - 1) / lanes
	var (
		mu       sync.Mutex
		all      samples
		firstErr error
		wg       sync.WaitGroup
	)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for lane := 0; lane < lanes; lane++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if expiry {
				select {
				case <-time.After(t.LeaseDuration * time.Duration(lane) / time.Duration(lanes)):
				case <-lctx.Done():
				}
			}
			s, err := b.runHandover(lctx, t, expiry, lane, perLane)
			mu.Lock()
			defer mu.Unlock()
			all.raw = append(all.raw, s.raw...)
			all.pastLD = append(all.pastLD, s.pastLD...)
			all.pastRenew = append(all.pastRenew, s.pastRenew...)
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("lane %d: %w", lane, err)
				cancel() // the run is incomplete anyway: stop the other lanes
			}
		}()
	}
	wg.Wait()
	return all, firstErr
}

// runHandover runs the chain A->B->C... for n rounds on Lease lane. If expiry,
// holders are stopped without releasing (ReleaseOnCancel=false).
func (b *bench) runHandover(ctx context.Context, t timing, expiry bool, lane, n int) (out samples, err error) {
	scen := "release"
	if expiry {
		scen = "expiry"
	}
	lease := fmt.Sprintf("lease-%s-%s-%02d", t.Name, scen, lane)
	limit := t.LeaseDuration*2 + t.RetryPeriod*4 + 10*time.Second
	mk := func(i int) (*candidate, error) {
		return b.startCandidate(ctx, t, lease, fmt.Sprintf("%s-%s-%02d-cand-%03d", t.Name, scen, lane, i), !expiry)
	}
	holder, err := mk(0)
	if err != nil {
		return
	}
	if _, err = waitStarted(ctx, holder, limit); err != nil {
		return
	}
	var all []*candidate
	all = append(all, holder)
	defer func() {
		for _, c := range all {
			c.stop(t.RenewDeadline + time.Second)
		}
	}()
	for i := 1; i <= n; i++ {
		var waiter *candidate
		if waiter, err = mk(i); err != nil {
			return
		}
		all = append(all, waiter)
		if err = waitObserves(ctx, waiter, holder.id, limit); err != nil {
			return
		}
		// Randomise the waiter's poll phase relative to t0 (client-go polls
		// every RetryPeriod * [1, 2.2) with JitterFactor 1.2).
		if err = jitterSleep(ctx, time.Duration(float64(t.RetryPeriod)*2.2)); err != nil {
			return
		}
		t0 := time.Now()
		holder.cancel()
		var renewExpiry time.Time
		if expiry {
			// Wait for the old holder's loop to exit (no release); its last Lease
			// write is its last renewal, timed at its send.
			select {
			case <-holder.done:
			case <-time.After(limit):
			}
			l, gerr := b.admin.CoordinationV1().Leases(b.ns).Get(ctx, lease, metav1.GetOptions{})
			sent := holder.lastWrite.Load()
			if gerr == nil && sent != 0 && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == holder.id {
				renewExpiry = time.Unix(0, sent).Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
			}
		}
		var t1 time.Time
		if t1, err = waitStarted(ctx, waiter, limit); err != nil {
			return
		}
		d := t1.Sub(t0)
		out.raw = append(out.raw, ms(d))
		if expiry {
			out.pastLD = append(out.pastLD, ms(d-t.LeaseDuration))
			if !renewExpiry.IsZero() {
				out.pastRenew = append(out.pastRenew, ms(t1.Sub(renewExpiry)))
			}
		}
		if b.verbose {
			fmt.Fprintf(os.Stderr, "  [%s/%s] round %d/%d: %s -> %s in %.1f ms\n", t.Name, scen, i, n, holder.id, waiter.id, ms(d))
		}
		holder.stop(t.RenewDeadline + time.Second)
		holder = waiter
	}
	return
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

func leaseRequestTotal(ctx context.Context, cs *kubernetes.Clientset) (float64, error) {
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") ||
			!strings.Contains(line, `resource="leases"`) ||
			!strings.Contains(line, `group="coordination.k8s.io"`) {
			continue
		}
		f := strings.Fields(line)
		v, perr := strconv.ParseFloat(f[len(f)-1], 64)
		if perr == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// measureRate returns (server-side lease req/s across the whole cluster,
// client-side lease req/s issued by our candidates) over window.
func (b *bench) measureRate(ctx context.Context, window time.Duration) (float64, float64, error) {
	s0, err := leaseRequestTotal(ctx, b.admin)
	if err != nil {
		return 0, 0, err
	}
	c0, t0 := b.clientN.Load(), time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return 0, 0, err
	}
	s1, err := leaseRequestTotal(ctx, b.admin)
	if err != nil {
		return 0, 0, err
	}
	el := time.Since(t0).Seconds()
	return (s1 - s0) / el, float64(b.clientN.Load()-c0) / el, nil
}

// steadyState measures the holder alone, then 1 holder + 3 waiters, each over
// window: server-side and client-side rates, [alone, all].
func (b *bench) steadyState(ctx context.Context, t timing, window time.Duration) (srv, cli [2]float64, err error) {
	lease := "lease-" + t.Name + "-steady"
	limit := t.LeaseDuration*2 + 10*time.Second
	var all []*candidate
	defer func() {
		for _, c := range all {
			c.stop(t.RenewDeadline + time.Second)
		}
	}()
	h, err := b.startCandidate(ctx, t, lease, t.Name+"-steady-holder", true)
	if err != nil {
		return srv, cli, err
	}
	all = append(all, h)
	if _, err := waitStarted(ctx, h, limit); err != nil {
		return srv, cli, err
	}
	if err := sleepCtx(ctx, 3*t.RetryPeriod); err != nil {
		return srv, cli, err
	}
	if srv[0], cli[0], err = b.measureRate(ctx, window); err != nil {
		return srv, cli, err
	}
	for i := 0; i < 3; i++ {
		w, err := b.startCandidate(ctx, t, lease, fmt.Sprintf("%s-steady-waiter-%d", t.Name, i), true)
		if err != nil {
			return srv, cli, err
		}
		all = append(all, w)
		if err := waitObserves(ctx, w, h.id, limit); err != nil {
			return srv, cli, err
		}
	}
	// settle a couple of retry periods
	if err := sleepCtx(ctx, 3*t.RetryPeriod); err != nil {
		return srv, cli, err
	}
	srv[1], cli[1], err = b.measureRate(ctx, window)
	return srv, cli, err
}

func summarize(cfg, scen string, v []float64, note string) latency {
	r := latency{System: "client-go", Config: cfg, Scenario: scen, Unit: "ms", N: len(v), Samples: v, Note: note}
	if r.Samples == nil {
		r.Samples = []float64{}
	}
	if len(v) == 0 {
		return r
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	pct := func(p float64) float64 { // nearest-rank
		k := int(math.Ceil(p/100*float64(len(s)))) - 1
		if k < 0 {
			k = 0
		}
		return s[k]
	}
	var sum float64
	for _, x := range s {
		sum += x
	}
	r.P50, r.P95, r.P99, r.Max, r.Min = pct(50), pct(95), pct(99), s[len(s)-1], s[0]
	r.Mean = round2(sum / float64(len(s)))
	return r
}

// lanesFlags are the numbers of lanes, a flag per config and scenario.
type lanesFlags map[string]*int

func (l lanesFlags) get(cfg, scen string) int { return *l[cfg+"-"+scen] }

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "candidate": // one contender of the failover mode, started by it
			runCandidate(os.Args[2:])
			return
		case "failover":
			runFailover(os.Args[2:])
			return
		}
	}
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig (default: $KUBECONFIG)")
	rounds := flag.Int("rounds", 200, "handovers per config and scenario (release, expiry)")
	lanes := lanesFlags{
		"default-release": flag.Int("lanes-default-release", 40, "lanes (Leases side by side) for default-timing releases"),
		"default-expiry":  flag.Int("lanes-default-expiry", 50, "lanes for default-timing expiries"),
		"tuned-release":   flag.Int("lanes-tuned-release", 10, "lanes for tuned-timing releases"),
		"tuned-expiry":    flag.Int("lanes-tuned-expiry", 10, "lanes for tuned-timing expiries"),
	}
	config := flag.String("config", "both", "default|tuned|both")
	out := flag.String("out", "clientgo.json", "JSON output file")
	timeout := flag.Duration("timeout", 15*time.Minute, "overall timeout")
	steady := flag.Duration("steady", 30*time.Second, "steady-state measurement window per config (0 disables)")
	baseline := flag.Duration("baseline", 30*time.Second, "idle baseline window for the cluster's lease request rate")
	verbose := flag.Bool("v", false, "print every round and keep client-go klog output")
	flag.Parse()

	if !*verbose {
		klog.SetLogger(logr.Discard())
	}
	var cfgs []timing
	switch *config {
	case "both":
		cfgs = []timing{timings["tuned"], timings["default"]}
	case "default", "tuned":
		cfgs = []timing{timings[*config]}
	default:
		fmt.Fprintln(os.Stderr, "--config must be default|tuned|both")
		os.Exit(2)
	}
	if *rounds < 0 || *rounds > 10000 {
		fmt.Fprintln(os.Stderr, "rounds out of range")
		os.Exit(2)
	}
	if *steady > 0 && *baseline < time.Second {
		fmt.Fprintln(os.Stderr, "--baseline must be at least 1s when --steady is on")
		os.Exit(2)
	}
	for k, v := range lanes {
		if *v < 1 || *v > 200 {
			fmt.Fprintf(os.Stderr, "lanes-%s out of range (1..200)\n", k)
			os.Exit(2)
		}
	}

	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "no kubeconfig: pass --kubeconfig PATH or set KUBECONFIG (make bench-clientgo passes target/cluster/kubeconfig)")
		os.Exit(2)
	}
	base, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fatal(err)
	}
	admin, err := kubernetes.NewForConfig(base)
	if err != nil {
		fatal(err)
	}
	b := &bench{base: base, admin: admin, ns: fmt.Sprintf("bench-clientgo-%d", os.Getpid()), verbose: *verbose}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	params := map[string]string{
		"config": *config, "rounds": strconv.Itoa(*rounds),
		"steady": steady.String(), "baseline": baseline.String(), "namespace": b.ns,
	}
	for k, v := range lanes {
		params["lanes_"+k] = strconv.Itoa(*v)
	}
	o := output{Source: "clientgo", Parameters: params, Latency: []latency{}, Figures: []figure{}, Versions: map[string]string{
		"client-go": clientGoVersion(), "go": runtime.Version(),
	}}
	if v, err := admin.Discovery().ServerVersion(); err == nil {
		o.Versions["kubernetes"] = v.GitVersion
	}

	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{}); err != nil {
		fatal(err)
	}
	var cleanupOnce sync.Once
	cleanup := func() {
		cleanupOnce.Do(func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer ccancel()
			if err := admin.CoreV1().Namespaces().Delete(cctx, b.ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				fmt.Fprintln(os.Stderr, "namespace cleanup:", err)
			}
		})
	}
	defer cleanup()

	started := time.Now()
	runErr := func() error {
		idle := math.NaN()
		if *steady > 0 {
			fmt.Fprintf(os.Stderr, "client-go: idle cluster lease request rate over %v\n", *baseline)
			srv, _, err := b.measureRate(ctx, *baseline)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			idle = srv
			o.Figures = append(o.Figures, figure{System: "client-go", Name: "idle_cluster_lease_requests_per_s", Value: round3(srv), Unit: "req/s",
				Note: fmt.Sprintf("apiserver_request_total{group=coordination.k8s.io,resource=leases} over %v with no bench candidate (the control plane's own leases)", *baseline)})
		}
		for _, t := range cfgs {
			timingNote := fmt.Sprintf("LeaseDuration %v, RenewDeadline %v, RetryPeriod %v", t.LeaseDuration, t.RenewDeadline, t.RetryPeriod)
			o.Latency = append(o.Latency, summarize(t.Name, "pod-deletion", nil,
				"not applicable: client-go leader election knows nothing of Pods; a candidate whose Pod is deleted "+
					"either releases on its way out (= release) or stops renewing (= expiry)"))
			if *rounds > 0 {
				l := lanes.get(t.Name, "release")
				fmt.Fprintf(os.Stderr, "client-go %s (%s): %d releases, %d lanes\n", t.Name, timingNote, *rounds, l)
				s, err := b.runLanes(ctx, t, false, *rounds, l)
				o.Latency = append(o.Latency, summarize(t.Name, "release", s.raw, fmt.Sprintf(
					"holder's context cancelled (ReleaseOnCancel) -> the next candidate's OnStartedLeading; %s; "+
						"%d Leases side by side, %d handovers each", timingNote, l, (*rounds+l-1)/l)))
				if err != nil {
					return fmt.Errorf("%s release: %w", t.Name, err)
				}
				l = lanes.get(t.Name, "expiry")
				fmt.Fprintf(os.Stderr, "client-go %s: %d expiries, %d lanes\n", t.Name, *rounds, l)
				s, err = b.runLanes(ctx, t, true, *rounds, l)
				raw := summarize(t.Name, "raw", s.raw, "")
				o.Latency = append(o.Latency, summarize(t.Name, "expiry-past-duration", s.pastRenew, fmt.Sprintf(
					"the holder stops without releasing; the next candidate's OnStartedLeading minus (the send of the holder's "+
						"last renewal, taken in its HTTP client as the request went out, + LeaseDuration), signed; from the stop itself p50 %.0f ms, p99 %.0f ms; %s; "+
						"%d Leases side by side, %d handovers each, their starts staggered over the lease duration", raw.P50, raw.P99, timingNote, l, (*rounds+l-1)/l)))
				if err != nil {
					return fmt.Errorf("%s expiry: %w", t.Name, err)
				}
			}
			if *steady > 0 {
				fmt.Fprintf(os.Stderr, "client-go %s: 1 holder + 3 waiters for %v\n", t.Name, *steady)
				srv, cli, err := b.steadyState(ctx, t, *steady)
				if err != nil {
					return fmt.Errorf("%s steady: %w", t.Name, err)
				}
				o.Figures = append(o.Figures,
					figure{System: "client-go", Config: t.Name, Name: "lease_requests_per_s_holder_only", Value: round3(srv[0] - idle), Unit: "req/s",
						Note: fmt.Sprintf("the holder alone: apiserver_request_total{group=coordination.k8s.io,resource=leases}, all verbs, "+
							"over a window of %v at steady state, less the idle rate (%.3f req/s); its transport counted %.3f req/s; %s",
							*steady, idle, cli[0], timingNote)},
					figure{System: "client-go", Config: t.Name, Name: "lease_requests_per_s_per_waiter", Value: round3((srv[1] - srv[0]) / 3), Unit: "req/s",
						Note: fmt.Sprintf("(1 holder + 3 waiters less the holder alone) / 3, server-side; client-side %.3f req/s", (cli[1]-cli[0])/3)},
					figure{System: "client-go", Config: t.Name, Name: "lease_requests_per_s_1_holder_3_waiters", Value: round3(srv[1] - idle), Unit: "req/s",
						Note: fmt.Sprintf("apiserver_request_total{group=coordination.k8s.io,resource=leases}, all verbs, over %v at steady state, "+
							"less the idle rate (%.3f req/s); %s", *steady, idle, timingNote)},
					figure{System: "client-go", Config: t.Name, Name: "lease_requests_per_s_1_holder_3_waiters_client_side", Value: round3(cli[1]), Unit: "req/s",
						Note: "lease requests sent by the 4 candidates, counted in their HTTP transport"})
			}
		}
		return nil
	}()
	o.Parameters["wall_seconds"] = strconv.Itoa(int(time.Since(started).Seconds()))

	cleanup()
	if err := writeJSON(*out, o); err != nil {
		fmt.Fprintln(os.Stderr, "write:", err)
	}
	printTable(o)
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "ERROR:", runErr)
		if errors.Is(runErr, context.DeadlineExceeded) {
			fmt.Fprintln(os.Stderr, "overall timeout reached")
		}
		os.Exit(1)
	}
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func writeJSON(path string, o output) error {
	data, err := json.MarshalIndent(o, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func printTable(o output) {
	fmt.Printf("client-go %s leader election (kubernetes %s)\n\n", o.Versions["client-go"], o.Versions["kubernetes"])
	fmt.Println("| config | scenario | n | p50 ms | p95 ms | p99 ms | max ms |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	for _, r := range o.Latency {
		fmt.Printf("| %s | %s | %d | %.1f | %.1f | %.1f | %.1f |\n", r.Config, r.Scenario, r.N, r.P50, r.P95, r.P99, r.Max)
	}
	fmt.Println()
	for _, f := range o.Figures {
		fmt.Printf("%s %s: %.3f %s\n", f.Config, f.Name, f.Value, f.Unit)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fatal:", err)
	os.Exit(1)
}
