package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	palisade "github.com/palisade-dev/palisade/clients/go"

	"github.com/jackc/pgx/v5/pgconn"
)

var uuidText = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func begin(t *testing.T, ctx context.Context) *sql.Tx {
	t.Helper()
	tx, err := testDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// write is the protected write of the tests: a ledger row.
func write(t *testing.T, ctx context.Context, tx *sql.Tx, key string, token int64) {
	t.Helper()
	if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (key, token) VALUES ($1, $2)", key, token); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := testDB.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func intents(t *testing.T, key string, token int64) int {
	t.Helper()
	return count(t, "SELECT count(*) FROM palisade.outbox WHERE key = $1 AND token = $2", key, token)
}

func TestEnqueueCommitsTheIntentWithTheFencedWrite(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey("current")
	tx := begin(t, ctx)
	write(t, ctx, tx, key, 7)
	id, err := palisade.Enqueue(ctx, tx, key, 7, []byte(`{"charge": {"amount": 1250, "currency": "EUR"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !uuidText.MatchString(id) {
		t.Fatalf("the intent id %q is not a uuid", id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var gotKey, state string
	var gotToken int64
	var samePayload bool
	err = testDB.QueryRow(`SELECT key, token, state, payload = '{"charge": {"amount": 1250, "currency": "EUR"}}'::jsonb
		FROM palisade.outbox WHERE id = $1`, id).Scan(&gotKey, &gotToken, &state, &samePayload)
	if err != nil {
		t.Fatalf("the committed intent %s: %v", id, err)
	}
	if gotKey != key || gotToken != 7 || state != "pending" || !samePayload {
		t.Fatalf("intent %s: key %q token %d state %q payload as sent %v", id, gotKey, gotToken, state, samePayload)
	}

	// The same token again (a holder writes many times with one token), then a higher one.
	for _, token := range []int64{7, 8} {
		tx := begin(t, ctx)
		other, err := palisade.Enqueue(ctx, tx, key, token, []byte(`[1, 2]`))
		if err != nil {
			t.Fatalf("token %d after 7: %v", token, err)
		}
		if other == id {
			t.Fatalf("token %d: the id %s again", token, id)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, "SELECT count(*) FROM palisade.outbox WHERE key = $1", key); n != 3 {
		t.Fatalf("%d intents of the key, want 3", n)
	}
}

func TestEnqueueOfAStaleTokenInsertsNothingAndAbortsTheWrite(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey("stale")
	tx := begin(t, ctx)
	if _, err := palisade.Enqueue(ctx, tx, key, 34, []byte(`{"n": 34}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	tx = begin(t, ctx)
	write(t, ctx, tx, key, 33) // the write first: the refused enqueue after it aborts it too
	id, err := palisade.Enqueue(ctx, tx, key, 33, []byte(`{"n": 33}`))
	if !errors.Is(err, palisade.ErrStaleToken) {
		t.Fatalf("Enqueue with token 33 after 34: id %q, err %v; want ErrStaleToken", id, err)
	}
	var stale *palisade.StaleTokenError
	if !errors.As(err, &stale) || stale.Key != key || stale.Token != 33 || stale.Highest != 34 {
		t.Fatalf("the stale error %#v", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "PF001" {
		t.Fatalf("the driver's error is not kept: %v", err)
	}
	if !strings.Contains(err.Error(), `stale fencing token 33 for key "`+key+`"`) ||
		!strings.Contains(err.Error(), "highest admitted token 34") {
		t.Fatalf("message: %s", err)
	}
	// A program that ignores the refusal and commits anyway writes nothing.
	if err := tx.Commit(); err == nil {
		t.Fatal("the aborted transaction committed")
	}
	if n := intents(t, key, 33); n != 0 {
		t.Fatalf("%d intents of the stale token", n)
	}
	if n := count(t, "SELECT count(*) FROM ledger WHERE key = $1", key); n != 0 {
		t.Fatalf("%d ledger rows of the stale token", n)
	}
	if n := intents(t, key, 34); n != 1 {
		t.Fatalf("%d intents of token 34, want 1", n)
	}
}

func TestEnqueueIsRolledBackWithItsTransaction(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey("rollback")
	tx := begin(t, ctx)
	write(t, ctx, tx, key, 5)
	if _, err := palisade.Enqueue(ctx, tx, key, 5, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := intents(t, key, 5); n != 0 {
		t.Fatalf("%d intents after the rollback", n)
	}
	if n := count(t, "SELECT count(*) FROM palisade.marks WHERE key = $1", key); n != 0 {
		t.Fatal("the rolled-back transaction's mark stayed")
	}
}

func TestEnqueueBadInputKeepsTheDatabasesError(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey("bad")
	for _, c := range []struct {
		what    string
		key     string
		token   int64
		payload []byte
		code    string
	}{
		{"a payload that is not JSON", key, 1, []byte(`{"unterminated": `), "22P02"},
		{"an empty payload", key, 1, nil, "22P02"},
		{"a negative token", key, -1, []byte(`{}`), "22023"},
		{"an empty key", "", 1, []byte(`{}`), "22023"},
	} {
		tx := begin(t, ctx)
		_, err := palisade.Enqueue(ctx, tx, c.key, c.token, c.payload)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != c.code || errors.Is(err, palisade.ErrStaleToken) {
			t.Errorf("%s: %v, want SQLSTATE %s", c.what, err, c.code)
		}
		_ = tx.Rollback()
	}
	if n := count(t, "SELECT count(*) FROM palisade.outbox WHERE key IN ($1, '')", key); n != 0 {
		t.Fatalf("%d intents of bad input", n)
	}
	if _, err := palisade.Enqueue(ctx, nil, key, 1, []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "transaction is nil") {
		t.Fatalf("a nil transaction: %v", err)
	}
}

// Two holders of one key race, each enqueueing in every transaction: the lower token
// enqueues until the higher one's first commit, then is refused, and every committed
// intent of the lower token comes before every one of the higher (a counter row,
// updated after Enqueue in the same transaction, numbers the commits). Without the
// fence in palisade.enqueue, the lower token's intents go on landing after the
// higher's.
func TestRacingHoldersEnqueueInTokenOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	key := uniqueKey("race")
	const low, high, highWrites = 100, 200, 20
	if _, err := testDB.ExecContext(ctx, "INSERT INTO commit_seq (key, n) VALUES ($1, 0)", key); err != nil {
		t.Fatal(err)
	}
	lowHasWritten, highIsDone := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var lowErr, highErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		// Until refused; at most 3 transactions once the higher token is done (the fence
		// refuses the first), and at most 10000 in all.
		after := 0
		for i := 0; i < 10000 && after < 3; i++ {
			if i == 5 {
				close(lowHasWritten)
			}
			select {
			case <-highIsDone:
				after++
			default:
			}
			if lowErr = enqueueNumbered(ctx, key, low); lowErr != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		defer close(highIsDone)
		select {
		case <-lowHasWritten:
		case <-ctx.Done():
			highErr = ctx.Err()
			return
		}
		for i := 0; i < highWrites && highErr == nil; i++ {
			highErr = enqueueNumbered(ctx, key, high)
		}
	}()
	wg.Wait()
	if highErr != nil {
		t.Fatalf("the higher token: %v", highErr)
	}
	var stale *palisade.StaleTokenError
	if !errors.As(lowErr, &stale) || stale.Token != low || stale.Highest != high {
		t.Fatalf("the lower token was not refused as stale: %v", lowErr)
	}
	if n := intents(t, key, high); n != highWrites {
		t.Fatalf("%d intents of the higher token, want %d", n, highWrites)
	}
	if n := intents(t, key, low); n < 5 {
		t.Fatalf("%d intents of the lower token before the higher's, want at least 5", n)
	}
	var lastLow, firstHigh int64
	err := testDB.QueryRow(`SELECT max(seq) FILTER (WHERE token = $1), min(seq) FILTER (WHERE token = $2)
		FROM ledger WHERE key = $3`, int64(low), int64(high), key).Scan(&lastLow, &firstHigh)
	if err != nil {
		t.Fatal(err)
	}
	if lastLow >= firstHigh {
		t.Fatalf("an intent of the lower token committed after the higher token's first: commit %d >= %d", lastLow, firstHigh)
	}
}

// enqueueNumbered is one holder's transaction: enqueue, number the commit, write.
func enqueueNumbered(ctx context.Context, key string, token int64) error {
	tx, err := testDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: ErrTxDone
	if _, err := palisade.Enqueue(ctx, tx, key, token, []byte(`{"holder": "racing"}`)); err != nil {
		return err
	}
	var seq int64
	if err := tx.QueryRowContext(ctx, "UPDATE commit_seq SET n = n + 1 WHERE key = $1 RETURNING n", key).Scan(&seq); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (key, token, seq) VALUES ($1, $2, $3)", key, token, seq); err != nil {
		return err
	}
	return tx.Commit()
}

// The stale error through lib/pq as well: its *pq.Error has the SQLState method too.
func TestEnqueueThroughLibPQ(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "disable") // lib/pq asks for TLS by default
	u.RawQuery = q.Encode()
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := uniqueKey("libpq")
	for _, token := range []int64{9, 8} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		id, err := palisade.Enqueue(ctx, tx, key, token, []byte(`{"driver": "lib/pq"}`))
		if token == 9 {
			if err != nil || !uuidText.MatchString(id) {
				t.Fatalf("token 9: id %q, %v", id, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var stale *palisade.StaleTokenError
		if !errors.As(err, &stale) || stale.Token != 8 || stale.Highest != 9 {
			t.Fatalf("token 8 after 9 through lib/pq: %v", err)
		}
		_ = tx.Rollback()
	}
	if n := intents(t, key, 8); n != 0 {
		t.Fatalf("%d intents of the stale token", n)
	}
}
