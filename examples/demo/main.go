// Command demo is pgbaton's end-to-end demonstration, run by `make demo`:
// four worker processes against one database run a cron job that must run
// once per slot although the workers' tickers are skewed, work items
// claimed with SKIP LOCKED and processed in fenced transactions, and a
// leader election. Mid-run the leader is SIGKILLed and another worker is
// SIGSTOPped past its lease while it holds an item; when it resumes, its
// late write is rejected by the fence. It ends with a table of invariants
// checked in the database and exits non-zero if any failed.
//
//	go run ./examples/demo [-dsn URL] [-workers 4] [-items 120] [-keep] [-timeout 60s]
//
// Connection: -dsn, else DATABASE_URL, else the libpq PG* variables when
// PGHOST is set, else a throwaway PostgreSQL cluster started from the
// server binaries on this machine and removed afterwards.
//
// Exit codes: 0 every invariant held, 1 error or a failed invariant,
// 2 usage.
//
// The demo is a program of its own (module github.com/pgbaton/pgbaton/examples/demo)
// so that neither the operator's CLI nor a service importing the library
// carries it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Exit codes, as documented in the package comment.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// workerArg is the first argument of the demo's own worker processes.
const workerArg = "worker"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the demo (or, with workerArg first, one of its workers) and
// returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && args[0] == workerArg {
		err = runWorker(ctx, args[1:], stdout, stderr)
	} else {
		err = runDemo(ctx, args, stdout, stderr)
	}
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "demo:", err)
		return exitUsage
	}
	fmt.Fprintln(stderr, "demo:", err)
	return exitError
}

// usageError marks errors that exit with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// parse parses args into fs, reporting bad flags as usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return nil
}

// connString resolves the connection string: -dsn, DATABASE_URL, or empty
// (pgx then reads the PG* variables).
func connString(dsn string) string {
	if dsn != "" {
		return dsn
	}
	return os.Getenv("DATABASE_URL")
}

// connect opens a pool on connString(dsn) and checks that the server
// answers.
func connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString(dsn))
	if err != nil {
		return nil, usageError{fmt.Errorf("bad connection string: %w", err)}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgbaton-demo"
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}
