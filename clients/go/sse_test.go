package palisade

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func readAll(t *testing.T, stream string) ([]sseEvent, error) {
	t.Helper()
	r := newSSEReader(strings.NewReader(stream))
	var evs []sseEvent
	for {
		ev, err := r.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestUnitSSEEventsCommentsAndLineEnds(t *testing.T) {
	stream := ": keepalive\n" +
		"event: session\n" +
		"data: {\"id\":\"s1\"}\n" +
		"\n" +
		": keepalive\r\n" +
		"event:grant\r\n" +
		"data:  two spaces\r\n" +
		"data: second line\r\n" +
		"id: 7\r\n" +
		"retry: 100\r\n" +
		"\r\n" +
		"data: no event field\n\n"
	evs, err := readAll(t, stream)
	if err != io.EOF {
		t.Fatalf("error = %v, want io.EOF", err)
	}
	want := []sseEvent{
		{Event: "session", Data: `{"id":"s1"}`},
		{Event: "grant", Data: " two spaces\nsecond line"},
		{Event: "message", Data: "no event field"},
	}
	if len(evs) != len(want) {
		t.Fatalf("events = %q, want %q", evs, want)
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Errorf("event %d = %q, want %q", i, evs[i], want[i])
		}
	}
}

func TestUnitSSEBlankLinesWithoutDataDispatchNothing(t *testing.T) {
	// An event type without data is dropped, and does not leak into the next event.
	evs, err := readAll(t, "\n\nevent: grant\n\ndata: x\n\n")
	if err != io.EOF {
		t.Fatalf("error = %v", err)
	}
	if len(evs) != 1 || evs[0] != (sseEvent{Event: "message", Data: "x"}) {
		t.Fatalf("events = %q", evs)
	}
}

func TestUnitSSEUnfinishedEventIsDropped(t *testing.T) {
	evs, err := readAll(t, "event: grant\ndata: {}\n\nevent: grant\ndata: {\"partial")
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("error = %v, want io.ErrUnexpectedEOF", err)
	}
	if len(evs) != 1 {
		t.Fatalf("events = %q, want only the finished one", evs)
	}
	evs, err = readAll(t, "event: grant\ndata: {}\n")
	if err != io.EOF || len(evs) != 0 {
		t.Fatalf("events = %q, error = %v; want none and io.EOF", evs, err)
	}
}
