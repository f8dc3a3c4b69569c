package palisade

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// codedError stands for a driver's error with a SQLSTATE method (pgx's *pgconn.PgError).
type codedError struct{ state, message string }

func (e *codedError) Error() string    { return e.message }
func (e *codedError) SQLState() string { return e.state }

func TestUnitStaleOrTurnsPF001IntoStaleTokenError(t *testing.T) {
	driver := &codedError{"PF001", `ERROR: write rejected: stale fencing token 33 for key "ns/billing" is lower than the highest admitted token 34 (SQLSTATE PF001)`}
	err := staleOr(fmt.Errorf("wrapped: %w", driver), "ns/billing", 33)
	var stale *StaleTokenError
	if !errors.Is(err, ErrStaleToken) || !errors.As(err, &stale) {
		t.Fatalf("got %v", err)
	}
	if stale.Key != "ns/billing" || stale.Token != 33 || stale.Highest != 34 || !errors.Is(err, driver) {
		t.Fatalf("got %+v", stale)
	}
	if !strings.Contains(err.Error(), `stale fencing token 33 for key "ns/billing"`) || !strings.Contains(err.Error(), "admitted token 34;") {
		t.Errorf("Error() = %s", err)
	}

	// Only the text, in pgx's format; no highest in it.
	err = staleOr(errors.New("ERROR: refused (SQLSTATE PF001)"), "k", 1)
	if !errors.As(err, &stale) || stale.Highest != -1 || !strings.Contains(err.Error(), "admitted token;") {
		t.Fatalf("text only: %v", err)
	}
}

func TestUnitStaleOrKeepsEveryOtherError(t *testing.T) {
	for _, err := range []error{
		&codedError{"40001", "could not serialize access (mentions PF001 in passing)"},
		&codedError{"22023", "palisade.fence: fencing token -1 is negative"},
		errors.New("ERROR: something else (SQLSTATE 42883)"),
		context.Canceled,
	} {
		if got := staleOr(err, "k", 1); got != err {
			t.Errorf("%v became %v", err, got)
		}
	}
}

func TestUnitEnqueueRefusesANilTransaction(t *testing.T) {
	_, err := Enqueue(context.Background(), nil, "k", 1, []byte(`{}`))
	if err == nil || !strings.Contains(err.Error(), "transaction is nil") {
		t.Fatalf("got %v", err)
	}
}
