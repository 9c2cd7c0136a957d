// Command pgbaton is the operator's tool for pgbaton: it shows what the
// database knows about locks, leases, runs and schema, releases a stuck lock
// with an audit record, migrates the schema and serves the admin page.
//
// Install: go install github.com/pgbaton/pgbaton/cmd/pgbaton@latest (a
// module of its own, so a service that imports the library never gets the
// CLI's dependencies), a prebuilt binary of a release, or the container
// image. The demo is a separate program (examples/demo, `make demo`).
//
// Connection: --dsn, else PGBATON_DSN, else DATABASE_URL, else the libpq
// PG* variables (PGHOST, PGPORT, PGUSER, PGDATABASE, ...): see `pgbaton
// help environment`.
//
// Output: -o table (default), wide, json or yaml. JSON and YAML write 64-bit
// integers (advisory keys, tokens, ids) as strings, so that consumers that
// parse numbers as doubles (JavaScript, jq) do not round them.
//
// Exit codes: 0 ok, 1 error, 2 usage, 3 not found / not held; pgbaton
// exec exits with its command's code, 75 when --skip found the lock held
// and 76 when the lock was lost while the command ran.
//
// [Operating] quotes every command's help, shows examples of its output
// and says how to release a stuck lock safely.
//
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
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
	code := runWith(ctx, streams{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

// streams are what the CLI reads and writes, and its environment.
type streams struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

// run executes the CLI with args, no standard input and the process's
// environment, and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, streams{stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, getenv: os.Getenv}, args)
}

func runWith(ctx context.Context, s streams, args []string) int {
	root := newRootCmd(s)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		if ec.err != nil {
			fmt.Fprintln(s.stderr, "pgbaton:", errorLine(ec.err))
		}
		return ec.code
	}
	fmt.Fprintln(s.stderr, "pgbaton:", errorLine(err))
	var ue usageError
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, errNotFound):
		return exitNotFound
	}
	return exitError
}

// errorLine is err's message without the "pgbaton: " that the library's
// and the schema's own messages start with: the CLI prefixes every error
// once.
func errorLine(err error) string {
	msg := err.Error()
	for strings.HasPrefix(msg, "pgbaton: ") {
		msg = strings.TrimPrefix(msg, "pgbaton: ")
	}
	return strings.ReplaceAll(msg, ": pgbaton: ", ": ")
}

// globals are the flags every command shares, and the streams.
type globals struct {
	dsn    string
	output string
	streams
}

// Output formats of -o.
var outputFormats = []string{"table", "wide", "json", "yaml"}

func newRootCmd(s streams) *cobra.Command {
	g := &globals{streams: s}
	root := &cobra.Command{
		Use:   "pgbaton",
		Short: "Inspect and operate pgbaton locks, leases and schema",
		Long: `pgbaton shows who holds which advisory lock and lease in a PostgreSQL
database, releases a stuck one with a reason written to the audit log,
migrates the pgbaton schema and serves an admin page with Prometheus metrics.

It connects with --dsn, PGBATON_DSN, DATABASE_URL or the libpq PG* variables:
see "pgbaton help environment".`,
		Example: `  # What does the database hold right now?
  pgbaton status
  pgbaton locks

  # The same as JSON, 64-bit keys and tokens as strings
  pgbaton leases --state all -o json

  # Shell completion (lock and lease names come from the database)
  source <(pgbaton completion bash)`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if g.output == "" {
				g.output = g.getenv(envOutput)
			}
			if g.output == "" {
				g.output = "table"
			}
			return oneOf("--output", g.output, outputFormats)
		},
	}
	root.SetOut(s.stdout)
	root.SetErr(s.stderr)
	root.SetIn(s.stdin)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&g.dsn, "dsn", "", "connection string (default: $"+envDSN+", else $DATABASE_URL, else the PG* variables)")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "", "output format: "+strings.Join(outputFormats, ", ")+" (default $"+envOutput+", else table)")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	root.AddCommand(newStatusCmd(g), newMigrateCmd(g), newLocksCmd(g), newLeasesCmd(g),
		newRunsCmd(g), newEventsCmd(g), newReleaseCmd(g), newResignCmd(g), newWatchCmd(g), newServeCmd(g),
		newVersionCmd(g), newExecCmd(g), newWatchdogCmd(), newEnvironmentTopic())
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

// oneOf is a usage error unless flag's value is one of allowed.
func oneOf(flag, value string, allowed []string) error {
	if slices.Contains(allowed, value) {
		return nil
	}
	return usageError{fmt.Errorf("%s must be one of %s, not %q", flag, strings.Join(allowed, ", "), value)}
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
