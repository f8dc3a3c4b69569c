package palisade

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// The fenced outbox: an intent to call an API that cannot check a fencing token (a
// payment provider, a mailer) is a row inserted by palisade.enqueue in PostgreSQL, in
// the transaction of the fenced write; `palisade outbox relay` sends it later, under a
// Lease of its own. palisade.enqueue runs palisade.fence first, so a stale holder's
// intent is never inserted, and its transaction aborts with SQLSTATE PF001.
//
// Only database/sql: the library requires no driver. The stale error is recognised by
// the SQLSTATE the driver's error reports through a SQLState() string method, which
// pgx's *pgconn.PgError and lib/pq's *pq.Error both have; the same code in the error's
// text, "(SQLSTATE PF001)" (pgx's format), is the fallback for a wrapper that keeps
// only the text.

// StaleTokenSQLState is the SQLSTATE palisade.fence (and so palisade.enqueue) raises
// for a token lower than the key's highest admitted.
const StaleTokenSQLState = "PF001"

// ErrStaleToken is matched (errors.Is) by the *StaleTokenError of a refused token.
var ErrStaleToken = errors.New("palisade: stale fencing token")

// StaleTokenError is the database's refusal of a stale token (SQLSTATE PF001): a
// holder with a higher token has written under Key since Token was granted. The
// transaction is aborted: roll it back and stop writing; retrying with the same token
// fails again. errors.Is(err, ErrStaleToken) is true for it; Unwrap gives the driver's
// error.
type StaleTokenError struct {
	Key   string
	Token int64
	// Highest is the key's highest admitted token as the database reported it, -1 when
	// its message did not say.
	Highest int64
	Err     error
}

func (e *StaleTokenError) Error() string {
	highest := ""
	if e.Highest >= 0 {
		highest = " " + strconv.FormatInt(e.Highest, 10)
	}
	return fmt.Sprintf("palisade: write rejected: stale fencing token %d for key %q is lower than the highest "+
		"admitted token%s; the transaction is aborted: roll it back and stop writing", e.Token, e.Key, highest)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Unwrap is the driver's error.
func (e *StaleTokenError) Unwrap() error { return e.Err }

const enqueueSQL = "SELECT palisade.enqueue($1, $2, $3::jsonb)"

// Enqueue inserts an intent into palisade's fenced outbox in tx, the transaction of
// the write it belongs to, and returns its id (the Idempotency-Key the relay sends).
// payload is the JSON the relay POSTs; the database checks it is JSON. The intent
// commits with tx or not at all; a stale token gives a *StaleTokenError (tx is then
// aborted), any other error the driver's own (SQLSTATE 40001 under REPEATABLE READ and
// SERIALIZABLE: retry the whole transaction).
//
// The SQL needs a PostgreSQL driver with $n placeholders (pgx's stdlib, lib/pq) and
// sql/palisade-fence.sql then sql/palisade-outbox.sql installed once; Enqueue never
// installs anything. A *sql.Tx is always a transaction, so there is no autocommit to
// refuse.
func Enqueue(ctx context.Context, tx *sql.Tx, key string, token int64, payload []byte) (string, error) {
	if tx == nil {
		return "", fmt.Errorf("palisade: Enqueue of key %q: the transaction is nil; enqueue in the transaction of the fenced write", key)
	}
	var id string
	// The payload goes as text: a driver sends []byte as bytea, which is not jsonb.
	err := tx.QueryRowContext(ctx, enqueueSQL, key, token, string(payload)).Scan(&id)
	if err != nil {
		return "", staleOr(err, key, token)
	}
	return id, nil
}

var (
	sqlStateInText = regexp.MustCompile(`\(SQLSTATE ` + StaleTokenSQLState + `\)`)
	// palisade.fence's message: "... is lower than the highest admitted token 34".
	highestInText = regexp.MustCompile(`highest admitted token (\d+)`)
)

// staleOr is err as a *StaleTokenError when it is the database's PF001, else err.
func staleOr(err error, key string, token int64) error {
	var coded interface{ SQLState() string }
	stale := false
	if errors.As(err, &coded) {
		stale = coded.SQLState() == StaleTokenSQLState
	} else {
		stale = sqlStateInText.MatchString(err.Error())
	}
	if !stale {
		return err
	}
	highest := int64(-1)
	if m := highestInText.FindStringSubmatch(err.Error()); m != nil {
		if h, perr := strconv.ParseInt(m[1], 10, 64); perr == nil {
			highest = h
		}
	}
	return &StaleTokenError{Key: key, Token: token, Highest: highest, Err: err}
}
