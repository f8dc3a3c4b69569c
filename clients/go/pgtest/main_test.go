package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx"
	_ "github.com/lib/pq"              // database/sql's "postgres"
)

// testDB is the run's own database, the fence and the outbox installed.
var testDB *sql.DB

// serverURL and dbURL: PALISADE_TEST_POSTGRES, and the run's database on that server.
var serverURL, dbURL string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	serverURL = os.Getenv("PALISADE_TEST_POSTGRES")
	if serverURL == "" {
		fmt.Fprintln(os.Stderr, "PALISADE_TEST_POSTGRES is not set: these tests need a real PostgreSQL "+
			"(postgres://postgres@127.0.0.1:15432/postgres; `make databases` starts one)")
		return 1
	}
	name := "palisade_go_outbox_" + randomHex(6)
	var err error
	if dbURL, err = withDatabase(serverURL, name); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := exec(ctx, serverURL, "CREATE DATABASE "+name); err != nil {
		fmt.Fprintf(os.Stderr, "creating the test database at %s: %v\n", serverURL, err)
		return 1
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, serverURL, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(os.Stderr, "dropping the test database %s: %v\n", name, err)
		}
	}()
	if err := install(ctx, dbURL); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if testDB, err = sql.Open("pgx", dbURL); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer testDB.Close()
	return m.Run()
}

// install runs the repository's fence and outbox SQL (whole files: without
// arguments, pgx sends them as one simple query), then the tests' own tables.
func install(ctx context.Context, dsn string) error {
	for _, file := range []string{"palisade-fence.sql", "palisade-outbox.sql"} {
		text, err := os.ReadFile(filepath.Join("..", "..", "..", "sql", file))
		if err != nil {
			return fmt.Errorf("reading the repository's sql/%s: %w", file, err)
		}
		if err := exec(ctx, dsn, string(text)); err != nil {
			return fmt.Errorf("installing sql/%s: %w", file, err)
		}
	}
	return exec(ctx, dsn, `CREATE TABLE ledger (id bigserial PRIMARY KEY, key text NOT NULL,
		token bigint NOT NULL, seq bigint);
		CREATE TABLE commit_seq (key text PRIMARY KEY, n bigint NOT NULL)`)
}

func exec(ctx context.Context, dsn, query string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, query)
	return err
}

func withDatabase(server, name string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("PALISADE_TEST_POSTGRES=%q is not a postgres:// URL", server)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// uniqueKey is a fence key no other test (or run) uses.
func uniqueKey(what string) string { return "go-outbox/" + what + "-" + randomHex(4) }
