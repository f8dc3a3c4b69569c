package palisade

import (
	"context"
	"errors"
	"net/http"
)

// The agent's error codes of an object write (besides CodeGrantLost).
const (
	CodeGrantNotHeld = "grant_not_held" // the grant is waiting or released
	CodeStaleToken   = "stale_token"    // a newer holder wrote the object
)

// rawBody is a request body sent as it is (application/octet-stream), not as JSON.
type rawBody []byte

// ObjectWritten is the agent's answer to PutObject (the ObjectWritten schema).
type ObjectWritten struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	// Token is the grant's token, the one the object was written with.
	Token int64 `json:"token"`
	// PreviousToken is the token on the object before; 0 when this write created it.
	PreviousToken int64  `json:"previousToken,omitempty"`
	ETag          string `json:"etag,omitempty"`
}

// staleJSON is the body of a stale_token refusal (the StaleToken schema).
type staleJSON struct {
	Key     string `json:"key"`
	Token   int64  `json:"token"`
	Highest int64  `json:"highest"`
}

// PutObject writes body at key in an S3 bucket through the object-store fence, by the
// agent, with the grant's own token: the caller never handles the token, so it cannot
// send the wrong one. The agent needs S3 credentials in its environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; AWS_ENDPOINT_URL_S3 for a server other
// than AWS S3).
//
// A newer holder of the Lease having written the object gives a *StaleTokenError
// (errors.Is(err, ErrStaleToken)): nothing was written; stop writing. A grant that
// has ended gives its Err without a request; one the agent no longer holds an
// *APIError with code CodeGrantLost or CodeGrantNotHeld. The store's own failures are
// *APIErrors too (no_such_bucket, object_store_error, object_store_not_configured).
func (g *Grant) PutObject(ctx context.Context, bucket, key string, body []byte) (ObjectWritten, error) {
	if err := g.Err(); err != nil {
		return ObjectWritten{}, err
	}
	s := g.session
	var written ObjectWritten
	path := expand(pathObject, s.id, g.namespace, g.name, bucket, key)
	_, err := s.request(ctx, answerSlack, http.MethodPut, path, nil, rawBody(body), &written)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.stale != nil {
		return ObjectWritten{}, &StaleTokenError{Key: key, Token: g.token, Highest: apiErr.stale.Highest, Err: apiErr}
	}
	if err != nil {
		return ObjectWritten{}, err
	}
	return written, nil
}
