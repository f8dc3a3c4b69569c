package palisade

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ErrLost is matched (errors.Is) by every error that says a grant was lost: the
// *LostError of Grant.Err, and what Acquire and Release return for a lost grant.
var ErrLost = errors.New("palisade: grant lost")

// ErrReleased is Grant.Err (and the cause of Grant.Context) once the grant was
// released by this process.
var ErrReleased = errors.New("palisade: grant released")

// ErrSessionClosed is returned by the methods of a Session after Session.Close.
var ErrSessionClosed = errors.New("palisade: session closed")

// LostReason says why a grant was lost. The agent's reasons (the Grant schema's
// lostReason) come first; the rest are the client's own, for a session that ended.
type LostReason string

const (
	// The agent's reasons.
	ReasonRevoked       LostReason = "Revoked"
	ReasonExpired       LostReason = "Expired"
	ReasonSuperseded    LostReason = "Superseded"
	ReasonLeaseDeleted  LostReason = "LeaseDeleted"
	ReasonClaimDeleted  LostReason = "ClaimDeleted"
	ReasonLocalDeadline LostReason = "LocalDeadline"

	// ReasonSessionEnded: the session's event stream ended or failed, or the agent
	// answered that it no longer knows the session (the agent died or restarted, or
	// the session was ended by a DELETE).
	ReasonSessionEnded LostReason = "SessionEnded"
	// ReasonKeepaliveMissed: no request naming the session succeeded within its
	// keepalive; the agent has ended the session, or is about to.
	ReasonKeepaliveMissed LostReason = "KeepaliveMissed"
	// ReasonReleased: the agent reports the grant released, but not by Grant.Release
	// (another request released it).
	ReasonReleased LostReason = "Released"
)

// agentReasons are the reasons the agent itself sends (checked against the OpenAPI
// document by a test).
var agentReasons = []LostReason{ReasonRevoked, ReasonExpired, ReasonSuperseded,
	ReasonLeaseDeleted, ReasonClaimDeleted, ReasonLocalDeadline}

// LostError is why a grant was lost. errors.Is(err, ErrLost) is true for it.
type LostError struct {
	Reason  LostReason
	Message string
}

func (e *LostError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("palisade: grant lost (%s)", e.Reason)
	}
	return fmt.Sprintf("palisade: grant lost (%s): %s", e.Reason, e.Message)
}

// Is makes errors.Is(err, ErrLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Error codes of the agent (the Error schema's `error`) that the client acts on.
const (
	CodeUnknownSession  = "unknown_session"
	CodeUnknownGrant    = "unknown_grant"
	CodeAlreadyAcquired = "already_acquired"
	CodeGrantLost       = "grant_lost"
	CodeInvalidField    = "invalid_field"
)

// APIError is an error answer of the agent: a 4xx (or 503) status with a JSON body
// {error, field?, message}.
type APIError struct {
	Status  int        // the HTTP status
	Code    string     // the stable code (`error`), e.g. "invalid_field"; "" when the body was not JSON
	Field   string     // the JSON field or parameter at fault, when one is
	Message string     // what is wrong, in words
	stale   *staleJSON // the fields of a stale_token refusal
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "palisade agent: %d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Field != "" {
		b.WriteString(" (" + e.Field + ")")
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// decodeAPIError turns an error answer into an *APIError. A body that is not the
// Error schema (a proxy's page, an empty body) keeps its text as the message.
func decodeAPIError(status int, body []byte) *APIError {
	var e struct {
		Error   string `json:"error"`
		Field   string `json:"field"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err == nil && e.Error != "" {
		apiErr := &APIError{Status: status, Code: e.Error, Field: e.Field, Message: e.Message}
		if e.Error == CodeStaleToken {
			apiErr.stale = &staleJSON{Highest: -1}
			_ = json.Unmarshal(body, apiErr.stale)
		}
		return apiErr
	}
	msg := strings.TrimSpace(string(body))
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &APIError{Status: status, Message: msg}
}

// isCode tells whether err is an *APIError with that code.
func isCode(err error, code string) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == code
}
