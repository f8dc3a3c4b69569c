package palisade

import (
	"bufio"
	"io"
	"strings"
)

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	Event string // the `event:` field; "message" when absent
	Data  string // the `data:` lines joined by "\n"
}

// sseReader reads Server-Sent Events (the WHATWG rules the agent's stream needs):
// lines end in LF or CRLF; a blank line dispatches the event gathered so far; a line
// starting with ':' is a comment (the agent's `: keepalive`); `field: value` loses one
// space after the colon; `id` and `retry` are ignored (the client never reconnects:
// a closed stream ends the session).
type sseReader struct {
	r *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReader(r)} }

// Next returns the next event, or the read error (io.EOF when the stream ended; an
// event not yet closed by a blank line is dropped, as the standard says).
func (s *sseReader) Next() (sseEvent, error) {
	var event string
	var data strings.Builder
	hasData := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if err == io.EOF && line != "" {
				err = io.ErrUnexpectedEOF
			}
			return sseEvent{}, err
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if !hasData {
				// No data: nothing to dispatch; the event type resets.
				event = ""
				continue
			}
			if event == "" {
				event = "message"
			}
			return sseEvent{Event: event, Data: data.String()}, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			event = value
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			hasData = true
		}
	}
}
