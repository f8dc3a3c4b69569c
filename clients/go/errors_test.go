package palisade

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestUnitDecodeAPIError(t *testing.T) {
	e := decodeAPIError(400, []byte(`{"error":"invalid_field","field":"name","message":"must be a DNS subdomain name"}`))
	want := APIError{Status: 400, Code: "invalid_field", Field: "name", Message: "must be a DNS subdomain name"}
	if *e != want {
		t.Fatalf("got %+v, want %+v", *e, want)
	}
	if got := e.Error(); got != "palisade agent: 400 invalid_field (name): must be a DNS subdomain name" {
		t.Errorf("Error() = %q", got)
	}
}

func TestUnitDecodeAPIErrorNotJSON(t *testing.T) {
	e := decodeAPIError(502, []byte("  bad gateway\n"))
	if e.Status != 502 || e.Code != "" || e.Message != "bad gateway" {
		t.Fatalf("got %+v", *e)
	}
	e = decodeAPIError(404, nil)
	if e.Message != http.StatusText(404) {
		t.Fatalf("empty body: got %+v", *e)
	}
	// JSON that is not the Error schema keeps its text.
	e = decodeAPIError(400, []byte(`{"detail":"x"}`))
	if e.Code != "" || e.Message != `{"detail":"x"}` {
		t.Fatalf("foreign JSON: got %+v", *e)
	}
}

func TestUnitErrorsMatch(t *testing.T) {
	var err error = fmt.Errorf("wrapped: %w", &LostError{Reason: ReasonExpired, Message: "m"})
	if !errors.Is(err, ErrLost) {
		t.Error("a *LostError does not match ErrLost")
	}
	if errors.Is(err, ErrReleased) {
		t.Error("a *LostError matches ErrReleased")
	}
	if !isCode(fmt.Errorf("x: %w", &APIError{Status: 404, Code: CodeUnknownSession}), CodeUnknownSession) {
		t.Error("isCode misses a wrapped *APIError")
	}
	if isCode(errors.New("unknown_session"), CodeUnknownSession) {
		t.Error("isCode matches a plain error")
	}
}
