// Command clientgo-bench measures leader-election handover latency and
// steady-state API load of k8s.io/client-go/tools/leaderelection (LeaseLock)
// against a real kube-apiserver, as a peer baseline for palisade.
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

const clientGoVersion = "v0.37.2"

type timing struct {
	Name                                     string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

var timings = map[string]timing{
	"default": {"default", 15 * time.Second, 10 * time.Second, 2 * time.Second},
	"tuned":   {"tuned", 2 * time.Second, 1500 * time.Millisecond, 250 * time.Millisecond},
}

type result struct {
	Config   string  `json:"config"`
	Scenario string  `json:"scenario"`
	Unit     string  `json:"unit"`
	N        int     `json:"n"`
	P50      float64 `json:"p50"`
	P95      float64 `json:"p95"`
	P99      float64 `json:"p99"`
	Max      float64 `json:"max"`
	Min      float64 `json:"min"`
	Mean     float64 `json:"mean"`
	Note     string  `json:"note,omitempty"`
}

type output struct {
	ClientGo   string            `json:"clientgo"`
	Server     string            `json:"server,omitempty"`
	Results    []result          `json:"results"`
	Parameters map[string]string `json:"parameters"`
}

// bench holds shared state.
type bench struct {
	base    *rest.Config
	admin   *kubernetes.Clientset
	ns      string
	clientN atomic.Int64 // lease requests issued by our candidates (client-side count)
}

// newClientset builds a clientset with its own transport (own TCP/TLS
// connections): a non-nil Proxy func makes client-go's transport cache skip it.
func (b *bench) newClientset() (*kubernetes.Clientset, error) {
	cfg := rest.CopyConfig(b.base)
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Timeout = 10 * time.Second
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return countingRT{rt: rt, n: &b.clientN}
	}
	return kubernetes.NewForConfig(cfg)
}

type countingRT struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/leases") {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

type candidate struct {
	id      string
	le      *leaderelection.LeaderElector
	cancel  context.CancelFunc
	done    chan struct{}
	started chan time.Time // receives time of OnStartedLeading
}

func (b *bench) startCandidate(ctx context.Context, t timing, lease, id string, releaseOnCancel bool) (*candidate, error) {
	cs, err := b.newClientset()
	if err != nil {
		return nil, err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: b.ns, Name: lease},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	c := &candidate{id: id, done: make(chan struct{}), started: make(chan time.Time, 1)}
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

// runHandover runs the chain A->B->C... for n rounds. If expiry, holders are
// stopped without releasing (ReleaseOnCancel=false).
func (b *bench) runHandover(ctx context.Context, t timing, expiry bool, n int) (raw, pastLD, pastRenew []float64, err error) {
	scen := "release"
	if expiry {
		scen = "expiry"
	}
	lease := fmt.Sprintf("lease-%s-%s", t.Name, scen)
	limit := t.LeaseDuration*2 + t.RetryPeriod*4 + 10*time.Second
	mk := func(i int) (*candidate, error) {
		return b.startCandidate(ctx, t, lease, fmt.Sprintf("%s-%s-cand-%03d", t.Name, scen, i), !expiry)
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
			// Wait for the old holder's loop to exit (no release), then read the
			// last renewTime it wrote.
			select {
			case <-holder.done:
			case <-time.After(limit):
			}
			l, gerr := b.admin.CoordinationV1().Leases(b.ns).Get(ctx, lease, metav1.GetOptions{})
			if gerr == nil && l.Spec.RenewTime != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == holder.id {
				renewExpiry = l.Spec.RenewTime.Time.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
			}
		}
		var t1 time.Time
		if t1, err = waitStarted(ctx, waiter, limit); err != nil {
			return
		}
		d := t1.Sub(t0)
		raw = append(raw, ms(d))
		if expiry {
			pastLD = append(pastLD, ms(d-t.LeaseDuration))
			if !renewExpiry.IsZero() {
				pastRenew = append(pastRenew, ms(t1.Sub(renewExpiry)))
			}
		}
		fmt.Fprintf(os.Stderr, "  [%s/%s] round %d/%d: %s -> %s in %.1f ms\n", t.Name, scen, i, n, holder.id, waiter.id, ms(d))
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

func (b *bench) steadyState(ctx context.Context, t timing, window time.Duration) (float64, float64, error) {
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
		return 0, 0, err
	}
	all = append(all, h)
	if _, err := waitStarted(ctx, h, limit); err != nil {
		return 0, 0, err
	}
	for i := 0; i < 3; i++ {
		w, err := b.startCandidate(ctx, t, lease, fmt.Sprintf("%s-steady-waiter-%d", t.Name, i), true)
		if err != nil {
			return 0, 0, err
		}
		all = append(all, w)
		if err := waitObserves(ctx, w, h.id, limit); err != nil {
			return 0, 0, err
		}
	}
	// settle a couple of retry periods
	if err := sleepCtx(ctx, 3*t.RetryPeriod); err != nil {
		return 0, 0, err
	}
	return b.measureRate(ctx, window)
}

func summarize(cfg, scen, unit string, v []float64, note string) result {
	r := result{Config: cfg, Scenario: scen, Unit: unit, N: len(v), Note: note}
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
	r.Mean = math.Round(sum/float64(len(s))*100) / 100
	return r
}

func main() {
	kubeconfig := flag.String("kubeconfig", "/work/main/target/cluster/kubeconfig", "admin kubeconfig")
	roundsRelease := flag.Int("rounds-release", 20, "voluntary-release handovers per config")
	roundsExpiry := flag.Int("rounds-expiry", 3, "expiry handovers per config")
	config := flag.String("config", "both", "default|tuned|both")
	out := flag.String("out", "clientgo-bench.json", "JSON output file")
	timeout := flag.Duration("timeout", 15*time.Minute, "overall timeout")
	steady := flag.Duration("steady", 30*time.Second, "steady-state measurement window per config (0 disables)")
	baseline := flag.Duration("baseline", 10*time.Second, "idle baseline window for cluster lease request rate (0 disables)")
	verbose := flag.Bool("v", false, "keep client-go klog output")
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
	if *roundsRelease < 0 || *roundsRelease > 10000 || *roundsExpiry < 0 || *roundsExpiry > 1000 {
		fmt.Fprintln(os.Stderr, "rounds out of range")
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
	b := &bench{base: base, admin: admin, ns: fmt.Sprintf("bench-clientgo-%d", os.Getpid())}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	o := output{ClientGo: clientGoVersion, Parameters: map[string]string{
		"config": *config, "rounds_release": strconv.Itoa(*roundsRelease), "rounds_expiry": strconv.Itoa(*roundsExpiry),
		"steady": steady.String(), "namespace": b.ns,
	}}
	if v, err := admin.Discovery().ServerVersion(); err == nil {
		o.Server = v.GitVersion
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

	runErr := func() error {
		if *baseline > 0 {
			srv, _, err := b.measureRate(ctx, *baseline)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			o.Results = append(o.Results, result{Config: "-", Scenario: "idle_cluster_lease_rps", Unit: "req/s", N: 1,
				P50: round2(srv), P95: round2(srv), P99: round2(srv), Max: round2(srv), Min: round2(srv), Mean: round2(srv),
				Note: "apiserver_request_total{leases} delta with no bench candidates (other cluster components)"})
		}
		for _, t := range cfgs {
			fmt.Fprintf(os.Stderr, "config %s: LeaseDuration=%v RenewDeadline=%v RetryPeriod=%v\n", t.Name, t.LeaseDuration, t.RenewDeadline, t.RetryPeriod)
			if *roundsRelease > 0 {
				raw, _, _, err := b.runHandover(ctx, t, false, *roundsRelease)
				o.Results = append(o.Results, summarize(t.Name, "release", "ms", raw, "t0=holder ctx cancel (ReleaseOnCancel) -> waiter OnStartedLeading"))
				if err != nil {
					return fmt.Errorf("%s release: %w", t.Name, err)
				}
			}
			if *roundsExpiry > 0 {
				raw, pastLD, pastRenew, err := b.runHandover(ctx, t, true, *roundsExpiry)
				o.Results = append(o.Results,
					summarize(t.Name, "expiry", "ms", raw, "t0=holder stopped silently (no release) -> waiter OnStartedLeading"),
					summarize(t.Name, "expiry_past_lease_duration", "ms", pastLD, "raw expiry latency minus LeaseDuration"),
					summarize(t.Name, "expiry_past_renew_expiry", "ms", pastRenew, "OnStartedLeading minus (last renewTime + leaseDurationSeconds)"))
				if err != nil {
					return fmt.Errorf("%s expiry: %w", t.Name, err)
				}
			}
			if *steady > 0 {
				srv, cli, err := b.steadyState(ctx, t, *steady)
				if err != nil {
					return fmt.Errorf("%s steady: %w", t.Name, err)
				}
				o.Results = append(o.Results,
					result{Config: t.Name, Scenario: "steady_lease_rps_server", Unit: "req/s", N: 1, P50: round2(srv), P95: round2(srv), P99: round2(srv), Max: round2(srv), Min: round2(srv), Mean: round2(srv),
						Note: fmt.Sprintf("apiserver_request_total{resource=leases,group=coordination.k8s.io} delta over %v, 1 holder + 3 waiters; includes other cluster lease traffic", *steady)},
					result{Config: t.Name, Scenario: "steady_lease_rps_client", Unit: "req/s", N: 1, P50: round2(cli), P95: round2(cli), P99: round2(cli), Max: round2(cli), Min: round2(cli), Mean: round2(cli),
						Note: "lease requests issued by the 4 bench candidates, counted client-side"})
			}
		}
		return nil
	}()

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

func writeJSON(path string, o output) error {
	data, err := json.MarshalIndent(o, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func printTable(o output) {
	fmt.Printf("client-go %s leader election (server %s)\n\n", o.ClientGo, o.Server)
	fmt.Println("| config | scenario | unit | n | p50 | p95 | p99 | max |")
	fmt.Println("|---|---|---|---:|---:|---:|---:|---:|")
	for _, r := range o.Results {
		fmt.Printf("| %s | %s | %s | %d | %.2f | %.2f | %.2f | %.2f |\n", r.Config, r.Scenario, r.Unit, r.N, r.P50, r.P95, r.P99, r.Max)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fatal:", err)
	os.Exit(1)
}
