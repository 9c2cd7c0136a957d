// Command withpg runs a command against a throwaway, migrated PostgreSQL
// cluster and removes the cluster afterwards:
//
//	go run ./internal/testkit/withpg -- sqlc vet
//	go run ./internal/testkit/withpg -durable -set max_connections=1600 -- ./bench
//
// The command sees the connection URL in PGBATON_DSN and SQLC_DATABASE_URL.
// withpg exits with the command's exit code.
//
// By default the cluster runs without fsync (fast, for tests and sqlc).
// -durable keeps fsync and synchronous_commit on, as benchmarks of writes
// need; -set name=value (repeatable) passes extra server settings.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/migrations"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("withpg", flag.ContinueOnError)
	durable := fs.Bool("durable", false, "keep fsync and synchronous_commit on (benchmarks)")
	settings := settingsFlag{}
	fs.Var(settings, "set", "extra server setting name=value (repeatable)")
	var sqlFiles sqlFilesFlag
	fs.Var(&sqlFiles, "sql", "SQL file to run after migrating (repeatable), e.g. the demo's tables for sqlc vet")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	args := fs.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withpg [-durable] [-set name=value]... [-sql file]... -- command [args...]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cluster, err := pgcluster.Start(ctx, pgcluster.Config{NoFsync: !*durable, Settings: settings})
	if err != nil {
		fmt.Fprintln(os.Stderr, "withpg:", err)
		return 1
	}
	defer cluster.Stop()
	url := cluster.URL("postgres")
	if err := migrations.UpURL(ctx, url); err != nil {
		fmt.Fprintln(os.Stderr, "withpg: migrate:", err)
		return 1
	}
	for _, f := range sqlFiles {
		if err := runSQLFile(ctx, url, f); err != nil {
			fmt.Fprintln(os.Stderr, "withpg:", err)
			return 1
		}
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "PGBATON_DSN="+url, "SQLC_DATABASE_URL="+url)
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "withpg:", err)
		return 1
	}
	return 0
}

// settingsFlag collects -set name=value flags.
type settingsFlag map[string]string

func (s settingsFlag) String() string { return fmt.Sprint(map[string]string(s)) }

func (s settingsFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=value, got %q", v)
	}
	s[name] = value
	return nil
}

// sqlFilesFlag collects -sql file flags.
type sqlFilesFlag []string

func (s *sqlFilesFlag) String() string { return strings.Join(*s, ",") }

func (s *sqlFilesFlag) Set(v string) error {
	*s = append(*s, v)
	return nil
}

func runSQLFile(ctx context.Context, url, path string) error {
	sql, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// A whole file of statements: the simple protocol, as psql -f would.
	if _, err := conn.Exec(ctx, string(sql), pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
