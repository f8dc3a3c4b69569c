package palisade

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultSocket is the agent's socket when neither SessionOptions nor the
// environment name one.
const DefaultSocket = "/run/palisade/agent.sock"

// The environment variables that point the client at the agent.
const (
	EnvSocket = "PALISADE_AGENT_SOCKET" // a Unix socket path
	EnvURL    = "PALISADE_AGENT_URL"    // http://127.0.0.1:PORT, the agent's loopback TCP port
)

// The agent's operations the client calls, as the OpenAPI document names their
// paths (a test checks each against src/agent/openapi.yaml).
const (
	pathSessions = "/v1/sessions"
	pathSession  = "/v1/sessions/{session}"
	pathEvents   = "/v1/sessions/{session}/events"
	pathLeases   = "/v1/sessions/{session}/leases"
	pathLease    = "/v1/sessions/{session}/leases/{namespace}/{name}"
	pathObject   = "/v1/sessions/{session}/leases/{namespace}/{name}/objects/{bucket}/{key}"
)

// The query parameter of a long poll.
const queryWaitMs = "waitMs"

var apiCalls = []struct{ method, path string }{
	{http.MethodPost, pathSessions},
	{http.MethodGet, pathSession},
	{http.MethodDelete, pathSession},
	{http.MethodGet, pathEvents},
	{http.MethodPost, pathLeases},
	{http.MethodGet, pathLease},
	{http.MethodDelete, pathLease},
	{http.MethodPut, pathObject},
}

// expand fills a path template's {params} in order, each escaped as one segment.
func expand(template string, params ...string) string {
	var b strings.Builder
	rest := template
	for _, p := range params {
		i := strings.IndexByte(rest, '{')
		j := strings.IndexByte(rest, '}')
		if i < 0 || j < i {
			panic("palisade: too many parameters for " + template)
		}
		b.WriteString(rest[:i])
		b.WriteString(url.PathEscape(p))
		rest = rest[j+1:]
	}
	if strings.IndexByte(rest, '{') >= 0 {
		panic("palisade: too few parameters for " + template)
	}
	b.WriteString(rest)
	return b.String()
}

// The agent answers within a request's waitMs plus 11 s (its API server calls are
// bounded); a little more than that, and the agent is taken to be hung.
const answerSlack = 12 * time.Second

// agent is the HTTP/1.1 client of one agent, on its Unix socket or TCP port.
type agent struct {
	base string // "http://localhost" for the socket, else the URL
	hc   *http.Client
}

// endpoint resolves where the agent is: the options first, then PALISADE_AGENT_URL,
// then PALISADE_AGENT_SOCKET, then DefaultSocket.
func endpoint(socket, rawURL string) (sock, base string, err error) {
	if socket == "" && rawURL == "" {
		rawURL = os.Getenv(EnvURL)
		if rawURL == "" {
			socket = os.Getenv(EnvSocket)
		}
	}
	if socket != "" && rawURL != "" {
		return "", "", fmt.Errorf("palisade: SessionOptions: set Socket or URL, not both")
	}
	if rawURL != "" {
		u, err := url.Parse(rawURL)
		if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return "", "", fmt.Errorf("palisade: agent URL %q: want http://HOST:PORT", rawURL)
		}
		return "", "http://" + u.Host, nil
	}
	if socket == "" {
		socket = DefaultSocket
	}
	return socket, "http://localhost", nil
}

func newAgent(socket, rawURL string) (*agent, error) {
	sock, base, err := endpoint(socket, rawURL)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		// Long polls run side by side with keepalives: keep a few connections.
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if sock != "" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
	} else {
		tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	}
	return &agent{base: base, hc: &http.Client{Transport: tr}}, nil
}

// do sends one request and decodes a JSON answer into out (when not nil). An error
// status is an *APIError. The caller bounds the time with ctx.
func (a *agent) do(ctx context.Context, method, path string, query url.Values, body, out any) (int, error) {
	var rd io.Reader
	kind := "application/json"
	switch b := body.(type) {
	case nil:
	case rawBody:
		// An object's bytes, as they are.
		rd, kind = bytes.NewReader(b), "application/octet-stream"
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(data)
	}
	u := a.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", kind)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("palisade agent: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("palisade agent: %s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		return resp.StatusCode, decodeAPIError(resp.StatusCode, data)
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("palisade agent: %s %s: decoding the answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// stream opens the session's event stream; the caller reads and closes the body.
func (a *agent) stream(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("palisade agent: GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		return nil, decodeAPIError(resp.StatusCode, data)
	}
	return resp.Body, nil
}

// The JSON bodies, as the OpenAPI document's schemas name their fields (a test
// checks every json tag against it).

type sessionRequest struct {
	KeepaliveMs int64  `json:"keepaliveMs,omitempty"`
	Name        string `json:"name,omitempty"`
}

type sessionJSON struct {
	ID          string      `json:"id"`
	Namespace   string      `json:"namespace"`
	KeepaliveMs int64       `json:"keepaliveMs"`
	Name        string      `json:"name,omitempty"`
	Grants      []grantJSON `json:"grants"`
}

type acquireRequest struct {
	Name            string `json:"name"`
	Namespace       string `json:"namespace,omitempty"`
	DurationSeconds int64  `json:"durationSeconds,omitempty"`
	HolderIdentity  string `json:"holderIdentity,omitempty"`
	WaitMs          int64  `json:"waitMs"`
	Slot            *int   `json:"slot,omitempty"`
}

type grantJSON struct {
	Name            string `json:"name"`
	Namespace       string `json:"namespace"`
	State           string `json:"state"`
	Token           int64  `json:"token,omitempty"`
	Slot            int    `json:"slot,omitempty"`     // absent from agents before semaphores: slot 0
	FenceKey        string `json:"fenceKey,omitempty"` // absent likewise: see Grant.FenceKey
	ValidForMs      int64  `json:"validForMs,omitempty"`
	LostReason      string `json:"lostReason,omitempty"`
	LostMessage     string `json:"lostMessage,omitempty"`
	Claim           string `json:"claim,omitempty"`
	ClaimUID        string `json:"claimUid,omitempty"`
	HolderIdentity  string `json:"holderIdentity,omitempty"`
	DurationSeconds int64  `json:"durationSeconds,omitempty"`
}

// The grant states (the Grant schema's `state`).
const (
	stateWaiting  = "waiting"
	stateHeld     = "held"
	stateLost     = "lost"
	stateReleased = "released"
)

var grantStates = []string{stateWaiting, stateHeld, stateLost, stateReleased}

func (g *grantJSON) key() string { return g.Namespace + "/" + g.Name }
