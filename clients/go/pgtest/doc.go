// Package pgtest holds the Go client's tests against a real PostgreSQL: palisade.Enqueue
// with the repository's sql/palisade-fence.sql and sql/palisade-outbox.sql installed.
//
// A module of its own, like clients/go/kube: the tests need a driver (pgx), and a
// requirement in clients/go's go.mod would be one of every program that uses the
// client, which needs only database/sql. Nothing here is imported by anything.
//
// The tests read PALISADE_TEST_POSTGRES (postgres://USER@HOST:PORT/DB of a role that
// may create databases; `make databases` starts one, the Makefile exports the URL) and
// fail without it. Each run creates a database of its own, palisade_go_outbox_<random>,
// installs the two files in it and drops it at the end.
package pgtest
