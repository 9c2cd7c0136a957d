// Command withpg runs a command against a throwaway, migrated PostgreSQL
// cluster and removes the cluster afterwards:
//
//	go run ./internal/cmd/withpg -- sqlc vet
//
// The command sees the connection URL in PGBATON_DSN and SQLC_DATABASE_URL.
// withpg exits with the command's exit code.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/pgbaton/pgbaton/internal/pgcluster"
	"github.com/pgbaton/pgbaton/migrations"
)

func main() {
	os.Exit(run())
}

func run() int {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withpg -- command [args...]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cluster, err := pgcluster.Start(ctx, pgcluster.Config{NoFsync: true})
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
