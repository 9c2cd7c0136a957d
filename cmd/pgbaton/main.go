// Command pgbaton is the operator's tool for pgbaton: it shows what the
// database knows about locks and schema, migrates the schema, and runs the
// demo.
//
// Connection: --dsn, else DATABASE_URL, else the libpq PG* variables
// (PGHOST, PGPORT, PGUSER, PGDATABASE, ...).
//
// Exit codes: 0 ok, 1 error, 2 usage, 3 not found / not held.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes, as documented in the package comment.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
)

// errNotFound marks errors that exit with exitNotFound.
var errNotFound = errors.New("not found")

// usageError marks errors that exit with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the CLI with args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "pgbaton:", err)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, errNotFound):
		return exitNotFound
	}
	return exitError
}

// globals are the flags every command shares.
type globals struct {
	dsn    string
	output string
	stdout io.Writer
	stderr io.Writer
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "pgbaton",
		Short:         "Inspect and operate pgbaton locks, leases and schema",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			switch g.output {
			case "table", "json", "wide":
				return nil
			}
			return usageError{fmt.Errorf("--output must be table, json or wide, not %q", g.output)}
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&g.dsn, "dsn", "", "connection string (default: $DATABASE_URL, else the PG* variables)")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table, json or wide")
	root.AddCommand(newStatusCmd(g), newMigrateCmd(g), newDemoCmd(g), newLocksCmd(g), newLeasesCmd(g),
		newRunsCmd(g), newEventsCmd(g), newReleaseCmd(g), newWatchCmd(g), newDemoWorkerCmd(g), newServeCmd(g))
	// Unknown subcommands and wrong argument counts are usage errors.
	root.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Errorf("unknown command %q; see pgbaton --help", args[0])}
		}
		return nil
	}
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	return root
}

// connString resolves the connection string: --dsn, DATABASE_URL, or empty
// (pgx then reads the PG* variables).
func (g *globals) connString() string {
	if g.dsn != "" {
		return g.dsn
	}
	return os.Getenv("DATABASE_URL")
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}
