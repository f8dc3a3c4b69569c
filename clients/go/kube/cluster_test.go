package palisadekube

// The TestCluster* tests run against the real API server of the local control plane,
// never a fake: tests/operator/go_kube.rs installs the chart with a service account
// fenced by a palisade Lease, publishes a token on that Lease, checks the policy is in
// force, and runs them with the environment below (make test-one TEST=operator
// ARGS=go_kube). make go-client-check skips them; run without that environment they
// fail, naming what is missing.

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
)

const (
	// The fenced service account's kubeconfig (a bearer token of the account).
	kubeconfigEnv = "PALISADE_OPERATOR_KUBECONFIG"
	// The namespace of the account and of its Lease.
	namespaceEnv = "PALISADE_OPERATOR_NAMESPACE"
	// The palisade Lease the chart's policy judges the account's writes by.
	leaseEnv = "PALISADE_OPERATOR_LEASE"
	// The fencing token that Lease publishes when the tests start (and again when each
	// test ends: a test that raises it puts it back).
	tokenEnv = "PALISADE_OPERATOR_TOKEN"
	// An administrator's kubeconfig: a user that is no service account, one that may
	// impersonate any, and that publishes tokens on the Lease as the controller would.
	adminEnv = "PALISADE_ADMIN_KUBECONFIG"
)

var (
	configMapsResource  = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	deploymentsResource = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	leasesResource      = schema.GroupVersionResource{Group: "palisade.dev", Version: "v1alpha1", Resource: "leases"}
)

// cluster is what the environment names.
type cluster struct {
	cfg       *rest.Config // the fenced service account's
	admin     *rest.Config
	account   string // the service account's username, from its token
	namespace string
	lease     string
	published int64
	server    string // the base URL of the API server the configs name
}

func requireEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: the TestCluster* tests run against a real API server, started by "+
			"tests/operator/go_kube.rs (make test-one TEST=operator ARGS=go_kube), which sets "+
			"%s, %s, %s, %s and %s; make go-client-check skips them",
			name, kubeconfigEnv, namespaceEnv, leaseEnv, tokenEnv, adminEnv)
	}
	return v
}

func clusterEnv(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{
		cfg:       loadKubeconfig(t, requireEnv(t, kubeconfigEnv)),
		admin:     loadKubeconfig(t, requireEnv(t, adminEnv)),
		namespace: requireEnv(t, namespaceEnv),
		lease:     requireEnv(t, leaseEnv),
	}
	token := requireEnv(t, tokenEnv)
	var err error
	if c.published, err = strconv.ParseInt(token, 10, 64); err != nil || c.published < 2 {
		t.Fatalf("%s=%q: want the token the Lease publishes, an integer above 1", tokenEnv, token)
	}
	if c.server, err = ownServer(c.cfg); err != nil {
		t.Fatal(err)
	}
	c.account = tokenSubject(t, c.cfg.BearerToken)
	// Whatever the caller's environment names, a test chooses its servers itself.
	t.Setenv(ServersEnv, "")
	return c
}

// loadKubeconfig is the rest.Config of the kubeconfig's current context: its server
// and CA, and a bearer token or a client certificate.
func loadKubeconfig(t *testing.T, path string) *rest.Config {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	decoded, _, err := clientcmdlatest.Codec.Decode(data, &schema.GroupVersionKind{Version: clientcmdlatest.Version, Kind: "Config"}, clientcmdapi.NewConfig())
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	kc := decoded.(*clientcmdapi.Config)
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.Clusters[ctx.Cluster] == nil || kc.AuthInfos[ctx.AuthInfo] == nil {
		t.Fatalf("%s: its current context %q does not name a cluster and a user", path, kc.CurrentContext)
	}
	cl, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
	if user.Exec != nil || user.AuthProvider != nil {
		t.Fatalf("%s: want a token or a client certificate, not an exec or auth-provider plugin", path)
	}
	// Paths in a kubeconfig are relative to its directory.
	file := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	return &rest.Config{
		Host:            cl.Server,
		BearerToken:     user.Token,
		BearerTokenFile: file(user.TokenFile),
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: cl.TLSServerName,
			CAData:     cl.CertificateAuthorityData, CAFile: file(cl.CertificateAuthority),
			CertData: user.ClientCertificateData, CertFile: file(user.ClientCertificate),
			KeyData: user.ClientKeyData, KeyFile: file(user.ClientKey),
		},
	}
}

// tokenSubject is the "sub" of a service account token: the account's username, as
// the API server will know it.
func tokenSubject(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("%s: want a service account's token (a JWT) in the kubeconfig", kubeconfigEnv)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Sub == "" {
		t.Fatalf("the token's claims %s name no subject (%v)", payload, err)
	}
	return claims.Sub
}

func (c *cluster) fence(t *testing.T, cfg *rest.Config, opts FenceOptions) *Fence {
	t.Helper()
	f, err := NewFence(context.Background(), cfg, c.namespace, c.lease, opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (c *cluster) lead(t *testing.T, f *Fence, token int64) {
	t.Helper()
	start := time.Now()
	if err := f.Lead(context.Background(), token); err != nil {
		t.Fatal(err)
	}
	t.Logf("Lead(%d) as %s confirmed in %v", token, f.Username(), time.Since(start).Round(time.Millisecond))
}

func dynamicClient(t *testing.T, cfg *rest.Config) *dynamic.DynamicClient {
	t.Helper()
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// resource is gvr in the test's namespace, through a client of cfg.
func (c *cluster) resource(t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource) dynamic.ResourceInterface {
	t.Helper()
	return dynamicClient(t, cfg).Resource(gvr).Namespace(c.namespace)
}

// staleMessage is the policy's refusal of the account's token when the Lease publishes
// current.
func (c *cluster) staleMessage(token, current int64) string {
	return fmt.Sprintf("stale fencing token %d of %s is lower than the current token %d of Lease %s/%s",
		token, c.account, current, c.namespace, c.lease)
}

// publish sets the token the Lease publishes, as the controller does on a grant.
func (c *cluster) publish(t *testing.T, token int64) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"status":{"fencingToken":%d}}`, token)
	_, err := c.resource(t, c.admin, leasesResource).Patch(context.Background(), c.lease, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("publishing token %d on Lease %s/%s: %v", token, c.namespace, c.lease, err)
	}
}

func configMap(name, by string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name},
		"data":     map[string]any{"by": by},
	}}
}

// deployment has no replicas: only its object and its /status matter here.
func deployment(name string) *unstructured.Unstructured {
	labels := map[string]any{"app": name}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"replicas": int64(0),
			"selector": map[string]any{"matchLabels": labels},
			"template": map[string]any{
				"metadata": map[string]any{"labels": labels},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "registry.invalid/none:0"}}},
			},
		},
	}}
}

// byPatch is a merge patch of a ConfigMap's data.by.
func byPatch(by string) []byte { return fmt.Appendf(nil, `{"data":{"by":%q}}`, by) }

var statusPatch = []byte(`{"status":{"observedGeneration":7}}`)

// refused checks that the API server refused a write with 403 and a message containing
// want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	var status apierrors.APIStatus
	switch {
	case err == nil:
		t.Errorf("%s: accepted; want it refused (%q)", what, want)
	case !errors.As(err, &status) || status.Status().Code != 403:
		t.Errorf("%s: %v; want a 403 refusal (%q)", what, err, want)
	case !strings.Contains(status.Status().Message, want):
		t.Errorf("%s: refused with %q; want %q", what, status.Status().Message, want)
	}
}

// closedServer is an https URL on loopback where nothing listens.
func closedServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "https://" + addr
}

func TestClusterNewFenceLearnsTheServiceAccount(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{})
	if f.Username() != c.account {
		t.Errorf("Username() = %q, want the token's subject %q", f.Username(), c.account)
	}
	if want := serviceAccountPrefix + c.namespace + ":"; !strings.HasPrefix(f.Username(), want) {
		t.Errorf("Username() = %q, want a service account of %s", f.Username(), c.namespace)
	}
	if f.timeout != defaultConfirmTimeout || f.Token() != 0 {
		t.Errorf("a new fence: confirm timeout %v, token %d; want %v and 0", f.timeout, f.Token(), defaultConfirmTimeout)
	}

	// The administrator is no service account: refused, naming the user the API
	// server knows it as.
	_, err := NewFence(context.Background(), c.admin, c.namespace, c.lease, FenceOptions{})
	if err == nil || !strings.Contains(err.Error(), "not as a service account") {
		t.Fatalf("NewFence with the admin kubeconfig: %v; want a refusal of a user that is no service account", err)
	}
	if block, _ := pem.Decode(c.admin.CertData); block != nil {
		cert, perr := x509.ParseCertificate(block.Bytes)
		if perr != nil {
			t.Fatal(perr)
		}
		if !strings.Contains(err.Error(), strconv.Quote(cert.Subject.CommonName)) {
			t.Errorf("the refusal does not name the admin %q: %v", cert.Subject.CommonName, err)
		}
	}
	t.Log(err)
}

// Before Lead the fence's clients send no token: the account's writes are refused,
// its reads are not (a follower can warm its caches).
func TestClusterAClientIsRefusedBeforeLead(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{})
	cms := c.resource(t, f.Config(), configMapsResource)
	ctx := context.Background()
	_, err := cms.Create(ctx, configMap("before-lead", "follower"), metav1.CreateOptions{})
	refused(t, "a create before Lead", err, "carries no fencing token")
	if _, err := cms.List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("a list before Lead: %v; reads are not judged", err)
	}
}

// Lead confirms against the one API server; the client made before it then carries
// the token, and its writes land: ConfigMaps, a Deployment and its /status.
func TestClusterLeadConfirmsAndTheWritesLand(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{})
	cfg := f.Config() // before Lead: it must carry the token Lead sets
	cms := c.resource(t, cfg, configMapsResource)
	deps := c.resource(t, cfg, deploymentsResource)
	ctx := context.Background()

	c.lead(t, f, c.published)
	if f.Token() != c.published {
		t.Errorf("Token() = %d, want %d", f.Token(), c.published)
	}
	if _, err := cms.Create(ctx, configMap("led", "leader"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the leader's create: %v", err)
	}
	if _, err := cms.Patch(ctx, "led", types.MergePatchType, byPatch("leader again"), metav1.PatchOptions{}); err != nil {
		t.Errorf("the leader's patch: %v", err)
	}
	if _, err := deps.Create(ctx, deployment("led"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the leader's Deployment: %v", err)
	}
	if _, err := deps.Patch(ctx, "led", types.MergePatchType, statusPatch, metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("the leader's /status patch: %v", err)
	}
	got, err := c.resource(t, c.admin, configMapsResource).Get(ctx, "led", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if by, _, _ := unstructured.NestedString(got.Object, "data", "by"); by != "leader again" {
		t.Errorf("the ConfigMap holds by=%q, want the leader's patch", by)
	}
	if err := cms.Delete(ctx, "led", metav1.DeleteOptions{}); err != nil {
		t.Errorf("the leader's delete: %v", err)
	}
	if err := deps.Delete(ctx, "led", metav1.DeleteOptions{}); err != nil {
		t.Errorf("the leader's Deployment delete: %v", err)
	}
}

// A second fence of the same account leads with a token below the published one: Lead
// confirms at once (the servers refuse the token below it too), and every write of its
// clients is refused, naming both tokens; the leader's stand.
func TestClusterALowerTokensWritesAreRefused(t *testing.T) {
	c := clusterEnv(t)
	ctx := context.Background()
	leader := c.fence(t, c.cfg, FenceOptions{})
	c.lead(t, leader, c.published)
	lcms := c.resource(t, leader.Config(), configMapsResource)
	if _, err := lcms.Create(ctx, configMap("contested", "leader"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.resource(t, leader.Config(), deploymentsResource).Create(ctx, deployment("contested"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	stale := c.fence(t, c.cfg, FenceOptions{ConfirmTimeout: 5 * time.Second})
	c.lead(t, stale, c.published-1)
	cms := c.resource(t, stale.Config(), configMapsResource)
	deps := c.resource(t, stale.Config(), deploymentsResource)
	want := c.staleMessage(c.published-1, c.published)
	_, err := cms.Create(ctx, configMap("stale", "deposed"), metav1.CreateOptions{})
	refused(t, "the stale create", err, want)
	_, err = cms.Patch(ctx, "contested", types.MergePatchType, byPatch("deposed"), metav1.PatchOptions{})
	refused(t, "the stale patch", err, want)
	_, err = deps.Patch(ctx, "contested", types.MergePatchType, statusPatch, metav1.PatchOptions{}, "status")
	refused(t, "the stale /status patch", err, want)
	refused(t, "the stale delete", cms.Delete(ctx, "contested", metav1.DeleteOptions{}), want)

	got, err := lcms.Get(ctx, "contested", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the leader's ConfigMap: %v", err)
	}
	if by, _, _ := unstructured.NestedString(got.Object, "data", "by"); by != "leader" {
		t.Errorf("the ConfigMap holds by=%q, want the leader's", by)
	}
	if _, err := lcms.Patch(ctx, "contested", types.MergePatchType, byPatch("leader again"), metav1.PatchOptions{}); err != nil {
		t.Errorf("the leader's patch after the stale ones: %v", err)
	}
}

// A token the Lease never published: the server keeps accepting the one below it, so
// Lead gives up after ConfirmTimeout naming the server and its last answer.
func TestClusterLeadAboveThePublishedTokenTimesOut(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{ConfirmTimeout: time.Second})
	token := c.published + 10
	start := time.Now()
	err := f.Lead(context.Background(), token)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatalf("Lead(%d) confirmed though the Lease publishes %d", token, c.published)
	}
	t.Log(err)
	for _, want := range []string{
		fmt.Sprintf("Lease %s/%s, token %d", c.namespace, c.lease, token),
		fmt.Sprintf("1 of 1 API servers did not confirm within 1s that they refuse token %d", token-1),
		c.server + " (last answer: 409 Conflict: admission accepted the predecessor's token",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q", want)
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the error does not wrap context.DeadlineExceeded: %v", err)
	}
	if elapsed < time.Second || elapsed > 5*time.Second {
		t.Errorf("Lead gave up after %v, want about 1s", elapsed)
	}
	if f.Token() != token {
		t.Errorf("Token() = %d after a failed Lead, want %d (set before confirming)", f.Token(), token)
	}
}

func TestClusterLeadStopsWithItsContext(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := f.Lead(ctx, c.published+10)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stopped before 1 of 1 API servers confirmed") {
		t.Fatalf("error %v, want the end of the caller's context", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Lead returned %v after its context ended", d)
	}
}

// A fence that names a Lease that does not exist: the dry-run create of it is created,
// so Lead fails at once. The token is above the published one so that the policy (which
// judges every stamped write by the account's own Lease) admits the dry run.
func TestClusterLeadFailsAtOnceWhenTheLeaseIsMissing(t *testing.T) {
	c := clusterEnv(t)
	f, err := NewFence(context.Background(), c.cfg, c.namespace, "no-such-lease", FenceOptions{ConfirmTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = f.Lead(context.Background(), c.published+100)
	if err == nil {
		t.Fatal("Lead confirmed by a Lease that does not exist")
	}
	t.Log(err)
	for _, want := range []string{c.server + " answered a dry-run create of the Lease with 201 Created: the Lease does not exist", "no-such-lease"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q", want)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Lead took %v to fail on a missing Lease", d)
	}
}

// The Lease publishes a new grant's token while its leader confirms: Lead waits (the
// server still admits the token below it), and confirms once the server has seen the
// grant; the previous token is then refused.
func TestClusterLeadWaitsForTheServerToSeeTheGrant(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{})
	granted := c.published + 1
	done := make(chan error, 1)
	go func() { done <- f.Lead(context.Background(), granted) }()
	select {
	case err := <-done:
		t.Fatalf("Lead(%d) returned before the Lease published it: %v", granted, err)
	case <-time.After(500 * time.Millisecond):
	}

	t.Cleanup(func() { c.restoreToken(t) })
	c.publish(t, granted)
	published := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Lead(%d) confirmed %v after the Lease published it", granted, time.Since(published).Round(time.Millisecond))
	case <-time.After(40 * time.Second):
		t.Fatal("Lead did not return within 40s of the grant")
	}
	deposed := c.fence(t, c.cfg, FenceOptions{ConfirmTimeout: 5 * time.Second})
	c.lead(t, deposed, c.published)
	_, err := c.resource(t, deposed.Config(), configMapsResource).Create(context.Background(), configMap("deposed", "deposed"), metav1.CreateOptions{})
	refused(t, "the predecessor's create", err, c.staleMessage(c.published, granted))
	if _, err := c.resource(t, f.Config(), configMapsResource).Create(context.Background(), configMap("successor", "successor"), metav1.CreateOptions{}); err != nil {
		t.Errorf("the successor's create: %v", err)
	}
}

// restoreToken publishes the environment's token again and waits until the API
// server judges by it (admits a write stamped with it), so the next test finds the
// Lease as the environment says.
func (c *cluster) restoreToken(t *testing.T) {
	c.publish(t, c.published)
	f := c.fence(t, c.cfg, FenceOptions{})
	body := fmt.Appendf(nil, `{"apiVersion":"palisade.dev/v1alpha1","kind":"Lease","metadata":{"name":%q,"namespace":%q},"spec":{}}`, c.lease, c.namespace)
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := f.ask(context.Background(), c.server, c.published, body)
		if a.kind == answerStillAccepts {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after publishing token %d again, the server still answers %s", c.published, a.text)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An administrator's config that impersonates the service account is fenced as that
// account: refused before Lead, its writes land after.
func TestClusterAnImpersonatingConfigIsFencedAsTheAccount(t *testing.T) {
	c := clusterEnv(t)
	cfg := rest.CopyConfig(c.admin)
	cfg.Impersonate.UserName = c.account
	f := c.fence(t, cfg, FenceOptions{})
	if f.Username() != c.account {
		t.Fatalf("Username() = %q, want the impersonated %q", f.Username(), c.account)
	}
	cms := c.resource(t, f.Config(), configMapsResource)
	ctx := context.Background()
	_, err := cms.Create(ctx, configMap("impersonated", "admin"), metav1.CreateOptions{})
	refused(t, "the impersonated create before Lead", err, "carries no fencing token")
	c.lead(t, f, c.published)
	if _, err := cms.Create(ctx, configMap("impersonated", "admin"), metav1.CreateOptions{}); err != nil {
		t.Errorf("the impersonated create after Lead: %v", err)
	}
	stale := c.fence(t, cfg, FenceOptions{})
	c.lead(t, stale, c.published-1)
	_, err = c.resource(t, stale.Config(), configMapsResource).Patch(ctx, "impersonated", types.MergePatchType, byPatch("stale"), metav1.PatchOptions{})
	refused(t, "the impersonated stale patch", err, c.staleMessage(c.published-1, c.published))
}

// A service account the chart does not name may not list the API servers: Lead fails
// at once, saying how to name them instead.
func TestClusterLeadFailsAtOnceWhenTheServersCannotBeListed(t *testing.T) {
	c := clusterEnv(t)
	cfg := rest.CopyConfig(c.admin)
	cfg.Impersonate.UserName = serviceAccountPrefix + c.namespace + ":not-named-by-the-chart"
	f := c.fence(t, cfg, FenceOptions{ConfirmTimeout: 10 * time.Second})
	start := time.Now()
	err := f.Lead(context.Background(), c.published)
	if err == nil || !strings.Contains(err.Error(), "EndpointSlices of Service default/kubernetes") ||
		!strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), ServersEnv) {
		t.Fatalf("error %v, want the refused listing and the way around it", err)
	}
	t.Log(err)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a refused listing took %v to fail", d)
	}
}

// With no servers given, Lead asks those the kubernetes Service's EndpointSlices
// publish, else the config's own server: the local plane runs its API server with
// --endpoint-reconciler-type none, so it publishes none there.
func TestClusterServersAreThePublishedOnesElseTheConfigs(t *testing.T) {
	c := clusterEnv(t)
	f := c.fence(t, c.cfg, FenceOptions{})
	ctx := context.Background()
	servers, err := f.apiServers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dynamicClient(t, c.admin).Resource(discoveryv1.SchemeGroupVersion.WithResource("endpointslices")).
		Namespace("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	slices := make([]discoveryv1.EndpointSlice, len(list.Items))
	for i, item := range list.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &slices[i]); err != nil {
			t.Fatal(err)
		}
	}
	want := endpointSliceServers(slices...)
	if len(want) == 0 {
		t.Logf("the kubernetes Service publishes no API server (%d EndpointSlices): the config's server %s", len(slices), c.server)
		want = []string{c.server}
	}
	if strings.Join(servers, " ") != strings.Join(want, " ") {
		t.Errorf("servers %q, want %q", servers, want)
	}
	c.lead(t, f, c.published)
}

// Servers given explicitly (FenceOptions.Servers, else PALISADE_APISERVERS) are asked,
// each at its own address and verified against the config's server name; Lead waits
// for every one, and names those that did not confirm.
func TestClusterExplicitServersAreEachAsked(t *testing.T) {
	c := clusterEnv(t)
	u, err := url.Parse(c.server)
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != "127.0.0.1" {
		t.Fatalf("the config names %s; the local plane's API server is on 127.0.0.1", c.server)
	}
	// The same server by another name, which the config does not use.
	byName := "https://localhost:" + u.Port()
	closed := closedServer(t)

	c.lead(t, c.fence(t, c.cfg, FenceOptions{Servers: []string{byName, c.server + "/"}}), c.published)

	f := c.fence(t, c.cfg, FenceOptions{Servers: []string{c.server, closed}, ConfirmTimeout: time.Second})
	err = f.Lead(context.Background(), c.published)
	if err == nil {
		t.Fatalf("Lead confirmed though %s does not answer", closed)
	}
	t.Log(err)
	msg := err.Error()
	if !strings.Contains(msg, "1 of 2 API servers did not confirm") || !strings.Contains(msg, closed+" (last answer: ") {
		t.Errorf("the error does not name %s alone as unconfirmed: %s", closed, msg)
	}
	if strings.Contains(msg, c.server+" (last answer") {
		t.Errorf("the error names the server that confirmed: %s", msg)
	}

	t.Setenv(ServersEnv, c.server+", "+closed)
	f = c.fence(t, c.cfg, FenceOptions{ConfirmTimeout: time.Second})
	if err := f.Lead(context.Background(), c.published); err == nil || !strings.Contains(err.Error(), closed) {
		t.Errorf("with %s=%q: %v; want %s named as unconfirmed", ServersEnv, os.Getenv(ServersEnv), err, closed)
	}
	t.Setenv(ServersEnv, c.server)
	c.lead(t, c.fence(t, c.cfg, FenceOptions{}), c.published)
}
