package palisadekube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// The confirm step's pace: each server is asked again after a pause that doubles from
// firstPause up to maxPause, each request bounded by askTimeout.
const (
	firstPause = 10 * time.Millisecond
	maxPause   = 250 * time.Millisecond
	askTimeout = 5 * time.Second

	// staleMarker is in the policy's refusal of a token lower than the Lease's.
	staleMarker = "stale fencing token"
)

var errConfirmTimeout = errors.New("confirm timeout")

// Lead sets token as the current one (later requests of every Config() carry it),
// then confirms: to every server, POST
// <server>/apis/palisade.dev/v1alpha1/namespaces/<ns>/leases?dryRun=All with body
// {"apiVersion":"palisade.dev/v1alpha1","kind":"Lease","metadata":{"name":<lease>,"namespace":<ns>},"spec":{}}
// stamped with token-1, TLS verified with cfg's CA and cfg's server name (ServerName
// = host of cfg.Host, so an IP endpoint is verified against the name the config
// uses), auth as cfg. Answers: 403 whose Status message contains "stale fencing
// token" = confirmed for that server; 409 (AlreadyExists) = that server still accepts
// token-1, ask again; 201 = the Lease does not exist: return an error; anything else
// or a network error: ask again. Backoff 10ms doubling to 250ms. After
// ConfirmTimeout: an error naming each server that did not confirm and its last
// answer. A token <= 0 needs no confirmation.
//
// Why: an API server judges a write against the Lease as its own informer has seen
// it, which lags etcd. Until every server refuses token-1, the deposed leader's
// writes can still be admitted somewhere; once a server refuses it, it refuses every
// older token for good (an informer only moves forward). The servers are asked
// concurrently.
//
// A token <= 0 is no token: requests go unstamped (tokens are positive). The token
// stays set after an error; the caller should not write (the API servers judge every
// write anyway). An error wraps ctx's error when ctx ended first, and
// context.DeadlineExceeded after ConfirmTimeout.
func (f *Fence) Lead(ctx context.Context, token int64) error {
	f.setToken(token)
	if token <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeoutCause(ctx, f.timeout, errConfirmTimeout)
	defer cancel()
	servers, err := f.apiServers(ctx)
	if err != nil {
		return fmt.Errorf("palisadekube: Lease %s/%s, token %d: %w", f.namespace, f.lease, token, err)
	}
	return f.confirm(ctx, servers, token)
}

// answerKind is what one API server's answer to the dry-run create means.
type answerKind int

const (
	// answerOther: unreachable, a 5xx, another refusal (RBAC, a Lease that has granted
	// no token yet as this server sees it): ask again.
	answerOther answerKind = iota
	// answerRefuses: refused token-1 as stale: this server has seen the grant.
	answerRefuses
	// answerStillAccepts: admission let token-1 through (the dry-run create then
	// found the Lease exists): this server has not seen the grant yet.
	answerStillAccepts
	// answerLeaseMissing: the dry-run create succeeded: the Lease does not exist, so
	// the policy judges nothing and no server will ever confirm.
	answerLeaseMissing
)

// answer is one server's answer: its meaning, and words for an error.
type answer struct {
	kind answerKind
	text string
}

// classify names the answer to a confirm request from its status code and body.
func classify(status int, body []byte) answer {
	msg := statusMessage(body)
	switch {
	case status == http.StatusForbidden && strings.Contains(msg, staleMarker):
		return answer{answerRefuses, "403 Forbidden: " + msg}
	case status == http.StatusConflict:
		return answer{answerStillAccepts, "409 Conflict: admission accepted the predecessor's token (" + msg + ")"}
	case status == http.StatusCreated:
		return answer{answerLeaseMissing, "201 Created: the Lease does not exist, so the policy judges nothing"}
	default:
		return answer{answerOther, fmt.Sprintf("%d %s: %s", status, http.StatusText(status), msg)}
	}
}

// statusMessage is the message of a metav1.Status body, else the body itself,
// shortened.
func statusMessage(body []byte) string {
	var status metav1.Status
	if json.Unmarshal(body, &status) == nil && status.Message != "" {
		return status.Message
	}
	text := strings.TrimSpace(string(body))
	if text == "" {
		return "(no body)"
	}
	if len(text) > 300 {
		text = text[:300] + "..."
	}
	return text
}

// confirm asks every server until each refuses token-1, the Lease proves missing, or
// ctx ends.
func (f *Fence) confirm(ctx context.Context, servers []string, token int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body, err := json.Marshal(map[string]any{
		"apiVersion": "palisade.dev/v1alpha1",
		"kind":       "Lease",
		"metadata":   map[string]string{"name": f.lease, "namespace": f.namespace},
		"spec":       map[string]any{},
	})
	if err != nil {
		return err
	}
	type result struct {
		server string
		last   answer
	}
	results := make(chan result, len(servers))
	for _, server := range servers {
		go func() {
			results <- result{server, f.confirmServer(ctx, server, token-1, body)}
		}()
	}
	var pending []result
	var missing *result
	for range servers {
		r := <-results
		switch r.last.kind {
		case answerRefuses:
		case answerLeaseMissing:
			if missing == nil {
				missing = &r
				cancel() // no server will ever confirm
			}
		default:
			pending = append(pending, r)
		}
	}
	prefix := fmt.Sprintf("palisadekube: Lease %s/%s, token %d", f.namespace, f.lease, token)
	if missing != nil {
		return fmt.Errorf("%s: %s answered a dry-run create of the Lease with %s; NewFence's namespace and lease must name the Lease this process leads by", prefix, missing.server, missing.last.text)
	}
	if len(pending) == 0 {
		return nil
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].server < pending[j].server })
	waiting := make([]string, len(pending))
	for i, r := range pending {
		waiting[i] = fmt.Sprintf("%s (last answer: %s)", r.server, r.last.text)
	}
	if errors.Is(context.Cause(ctx), errConfirmTimeout) {
		return fmt.Errorf("%s: %d of %d API servers did not confirm within %v that they refuse token %d: %s: %w",
			prefix, len(pending), len(servers), f.timeout, token-1, strings.Join(waiting, "; "), ctx.Err())
	}
	return fmt.Errorf("%s: stopped before %d of %d API servers confirmed that they refuse token %d: %s: %w",
		prefix, len(pending), len(servers), token-1, strings.Join(waiting, "; "), ctx.Err())
}

// confirmServer asks server until it refuses stale or answers that the Lease is
// missing, or ctx ends; it returns the last answer.
func (f *Fence) confirmServer(ctx context.Context, server string, stale int64, body []byte) answer {
	last := answer{answerOther, "not asked"}
	pause := firstPause
	for {
		a := f.ask(ctx, server, stale, body)
		if ctx.Err() != nil && last.text != "not asked" {
			// Cut short by the end of ctx: the answer before says more.
			return last
		}
		last = a
		if last.kind == answerRefuses || last.kind == answerLeaseMissing {
			return last
		}
		if !sleep(ctx, pause) {
			return last
		}
		pause = min(2*pause, maxPause)
	}
}

// ask sends server one dry-run create of the Lease stamped with stale.
func (f *Fence) ask(ctx context.Context, server string, stale int64, body []byte) answer {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	u := server + "/apis/palisade.dev/v1alpha1/namespaces/" + f.namespace + "/leases?dryRun=All"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return answer{answerOther, err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	setImpersonation(req.Header, f.username, strconv.FormatInt(stale, 10))
	resp, err := f.probe.Do(req)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // the server is named beside it
		}
		return answer{answerOther, err.Error()}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return answer{answerOther, fmt.Sprintf("%d %s, reading the body: %v", resp.StatusCode, http.StatusText(resp.StatusCode), err)}
	}
	return classify(resp.StatusCode, data)
}

// apiServers are the servers to confirm against: those given, else the ready
// endpoints of Service default/kubernetes (each API server publishes itself there),
// else cfg's own server. A refusal to list them is an error at once; other errors are
// retried until ctx ends.
func (f *Fence) apiServers(ctx context.Context) ([]string, error) {
	if f.servers != nil {
		return f.servers, nil
	}
	pause := firstPause
	for {
		var list discoveryv1.EndpointSliceList
		err := f.api.Get().AbsPath("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices").
			Param("labelSelector", discoveryv1.LabelServiceName+"=kubernetes").
			Do(ctx).Into(&list)
		if err == nil {
			if servers := endpointSliceServers(list.Items...); len(servers) > 0 {
				return servers, nil
			}
			own, err := ownServer(f.cfg)
			if err != nil {
				return nil, err
			}
			return []string{own}, nil
		}
		why := fmt.Errorf("listing the API servers (EndpointSlices of Service default/kubernetes): %w", err)
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w (the chart grants list of endpointslices in default; else name the servers in FenceOptions.Servers or %s)", why, ServersEnv)
		}
		if !sleep(ctx, pause) {
			return nil, fmt.Errorf("%w: %w", why, ctx.Err())
		}
		pause = min(2*pause, maxPause)
	}
}

// endpointSliceServers are the base URLs https://<address>:<port> of every ready
// endpoint address of the slices, on their port named "https", sorted, each once.
func endpointSliceServers(slices ...discoveryv1.EndpointSlice) []string {
	seen := map[string]bool{}
	var servers []string
	for _, slice := range slices {
		var port *int32
		for _, p := range slice.Ports {
			if p.Name != nil && *p.Name == "https" && p.Port != nil {
				port = p.Port
				break
			}
		}
		if port == nil {
			continue
		}
		for _, ep := range slice.Endpoints {
			// An unknown readiness (nil) counts as ready, as the API documents.
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				server := "https://" + net.JoinHostPort(addr, strconv.Itoa(int(*port)))
				if !seen[server] {
					seen[server] = true
					servers = append(servers, server)
				}
			}
		}
	}
	sort.Strings(servers)
	return servers
}

// ownServer is the base URL of cfg's server.
func ownServer(cfg *rest.Config) (string, error) {
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(base.String(), "/"), nil
}

// sleep waits d, or until ctx ends (then false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
