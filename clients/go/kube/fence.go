package palisadekube

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

const (
	// TokenExtra is the impersonation extra that carries the fencing token; admission
	// sees it as request.userInfo.extra["palisade.dev/fencing-token"].
	TokenExtra = "palisade.dev/fencing-token"

	// tokenHeader is TokenExtra as a header: a header name cannot hold a "/", so it is
	// percent-escaped (the API server lowercases and unescapes the name).
	tokenHeader = transport.ImpersonateUserExtraHeaderPrefix + "palisade.dev%2Ffencing-token"

	// ServersEnv names the API servers to confirm against when FenceOptions.Servers is
	// empty: comma-separated base URLs.
	ServersEnv = "PALISADE_APISERVERS"

	defaultConfirmTimeout = 30 * time.Second
	serviceAccountPrefix  = "system:serviceaccount:"
)

// Fence stamps a rest.Config's requests with the current leader's fencing token and
// confirms the API servers refuse the predecessor's.
//
// One Fence serves one operator identity and one Lease. Its methods are safe for
// concurrent use.
type Fence struct {
	cfg       *rest.Config // the caller's config, copied; never stamped
	namespace string
	lease     string
	username  string
	servers   []string // given (options or ServersEnv); nil: discovered at each Lead
	timeout   time.Duration

	// stamp is the token every Config() request carries; nil while there is none.
	stamp atomic.Pointer[stamp]

	api   *rest.RESTClient // unstamped: SelfSubjectReview, EndpointSlices
	probe *http.Client     // the confirm step's dry-run creates, to any server
}

// stamp is a token and its header value, swapped as one.
type stamp struct {
	token int64
	value string
}

// FenceOptions tune NewFence; the zero value is the usual choice.
type FenceOptions struct {
	// Servers are the API servers' base URLs to confirm against; empty: the env
	// PALISADE_APISERVERS (comma-separated), else the addresses of the EndpointSlices
	// of Service default/kubernetes (label kubernetes.io/service-name=kubernetes, ready
	// endpoints, port named "https"), else the config's own Host. The EndpointSlices
	// are listed at every Lead, so a server added since NewFence is confirmed too.
	Servers []string
	// ConfirmTimeout bounds Lead's confirmation; 0 is 30s.
	ConfirmTimeout time.Duration
}

// NewFence learns the config's username with a SelfSubjectReview
// (authentication.k8s.io/v1, unstamped), and refuses (error naming it) a username
// that is not a service account (system:serviceaccount:<ns>:<name>).
// lease/namespace: the palisade Lease it leads by.
//
// A config that impersonates the service account (cfg.Impersonate.UserName, say an
// administrator's kubeconfig in a test) is fenced as that account: the
// SelfSubjectReview answers the impersonated name. cfg is copied; later changes to it
// are not seen.
func NewFence(ctx context.Context, cfg *rest.Config, namespace, lease string, opts FenceOptions) (*Fence, error) {
	servers, err := checkFenceArgs(cfg, namespace, lease, opts, os.Getenv(ServersEnv))
	if err != nil {
		return nil, err
	}
	f := &Fence{
		cfg:       rest.CopyConfig(cfg),
		namespace: namespace,
		lease:     lease,
		servers:   servers,
		timeout:   opts.ConfirmTimeout,
	}
	if f.timeout == 0 {
		f.timeout = defaultConfirmTimeout
	}
	if f.api, err = newAPIClient(f.cfg); err != nil {
		return nil, fmt.Errorf("palisadekube: NewFence: %w", err)
	}
	if f.probe, err = newProbeClient(f.cfg); err != nil {
		return nil, fmt.Errorf("palisadekube: NewFence: %w", err)
	}

	var review authenticationv1.SelfSubjectReview
	err = f.api.Post().AbsPath("/apis/authentication.k8s.io/v1/selfsubjectreviews").
		Body(&authenticationv1.SelfSubjectReview{}).Do(ctx).Into(&review)
	if err != nil {
		return nil, fmt.Errorf("palisadekube: NewFence: learning the config's username (SelfSubjectReview): %w", err)
	}
	f.username = review.Status.UserInfo.Username
	if err := checkServiceAccount(f.username); err != nil {
		return nil, fmt.Errorf("palisadekube: NewFence: %w", err)
	}
	return f, nil
}

// checkFenceArgs validates NewFence's arguments without a request, and returns the
// servers given by opts or by env (the value of ServersEnv); nil means discover them.
func checkFenceArgs(cfg *rest.Config, namespace, lease string, opts FenceOptions, env string) ([]string, error) {
	fail := func(format string, args ...any) ([]string, error) {
		return nil, fmt.Errorf("palisadekube: NewFence: "+format, args...)
	}
	switch {
	case cfg == nil:
		return fail("cfg is nil")
	case cfg.Host == "":
		return fail("cfg.Host is empty")
	case opts.ConfirmTimeout < 0:
		return fail("FenceOptions.ConfirmTimeout is negative (%v)", opts.ConfirmTimeout)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fail("namespace %q of the Lease: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(lease); len(errs) > 0 {
		return fail("Lease name %q: %s", lease, strings.Join(errs, "; "))
	}
	if len(opts.Servers) > 0 {
		servers := make([]string, 0, len(opts.Servers))
		for _, s := range opts.Servers {
			base, err := parseServer(s)
			if err != nil {
				return fail("FenceOptions.Servers: %v", err)
			}
			servers = append(servers, base)
		}
		return servers, nil
	}
	if strings.TrimSpace(env) == "" {
		return nil, nil
	}
	servers, err := parseServerList(env)
	if err != nil {
		return fail("%s: %v", ServersEnv, err)
	}
	return servers, nil
}

// parseServerList parses "a,b,c" (spaces around entries ignored) as base URLs.
func parseServerList(list string) ([]string, error) {
	var servers []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		base, err := parseServer(s)
		if err != nil {
			return nil, err
		}
		servers = append(servers, base)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%q names no server", list)
	}
	return servers, nil
}

// parseServer checks that s is an absolute http(s) URL with a host and neither query
// nor fragment, and returns it without a trailing "/".
func parseServer(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%q is not an API server's base URL such as https://10.0.0.1:6443", s)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// checkServiceAccount refuses a username that is not a service account's: the chart's
// policy fences a service account, and only a service account's groups are added by
// the API server when it is impersonated without naming any.
func checkServiceAccount(username string) error {
	tail, ok := strings.CutPrefix(username, serviceAccountPrefix)
	namespace, name, found := strings.Cut(tail, ":")
	if !ok || !found || len(validation.IsDNS1123Label(namespace)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("the config authenticates as %q, not as a service account (%s<namespace>:<name>): only a service account's writes are fenced", username, serviceAccountPrefix)
	}
	return nil
}

// Config returns a copy of cfg whose transport stamps every request: while a token is
// set, headers "Impersonate-User: <username>" and
// "Impersonate-Extra-palisade.dev%2Ffencing-token: <token>" (no Impersonate-Group: the
// API server adds a service account's groups). Before Lead is first called it sends
// requests unstamped (the API server refuses them for a fenced identity, which is the
// point).
//
// The token is read at every request, so clients made from Config before Lead (an
// informer factory, a manager) carry each later Lead's token.
func (f *Fence) Config() *rest.Config {
	c := rest.CopyConfig(f.cfg)
	c.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return &stampingTransport{fence: f, next: next}
	})
	return c
}

// Token is the current token (0 before Lead).
func (f *Fence) Token() int64 {
	if s := f.stamp.Load(); s != nil {
		return s.token
	}
	return 0
}

// Username is the config's identity, learned by NewFence: the service account whose
// writes the API server fences.
func (f *Fence) Username() string { return f.username }

// setToken makes token the one every Config() request carries; a token <= 0 is none
// (tokens are positive), and requests go unstamped.
func (f *Fence) setToken(token int64) {
	if token <= 0 {
		f.stamp.Store(nil)
		return
	}
	f.stamp.Store(&stamp{token: token, value: strconv.FormatInt(token, 10)})
}

// stampingTransport adds the impersonation headers of the fence's current token.
type stampingTransport struct {
	fence *Fence
	next  http.RoundTripper
}

func (t *stampingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	s := t.fence.stamp.Load()
	if s == nil {
		return t.next.RoundTrip(req)
	}
	// A RoundTripper must not modify the caller's request.
	req = req.Clone(req.Context())
	setImpersonation(req.Header, t.fence.username, s.value)
	return t.next.RoundTrip(req)
}

// WrappedRoundTripper lets client-go's helpers see the transport underneath.
func (t *stampingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

func setImpersonation(h http.Header, username, token string) {
	h.Set(transport.ImpersonateUserHeader, username)
	h.Set(tokenHeader, token)
}

// newAPIClient is an unstamped REST client that knows the few kinds the fence reads;
// a codec of its own keeps the whole client-go clientset out of this package.
func newAPIClient(cfg *rest.Config) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := authenticationv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	c := rest.CopyConfig(cfg)
	c.APIPath = "/apis"
	c.GroupVersion = &authenticationv1.SchemeGroupVersion
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	return rest.RESTClientFor(c)
}

// newProbeClient is an HTTP client with cfg's credentials that verifies every
// server's certificate against the name cfg uses (its TLS server name, else the host
// of cfg.Host), so an API server reached at its own address needs no certificate
// for that address.
func newProbeClient(cfg *rest.Config) (*http.Client, error) {
	c := rest.CopyConfig(cfg)
	if c.TLSClientConfig.ServerName == "" {
		base, _, err := rest.DefaultServerUrlFor(c)
		if err != nil {
			return nil, err
		}
		c.TLSClientConfig.ServerName = base.Hostname()
	}
	return rest.HTTPClientFor(c)
}
