package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

// cliEnv runs the CLI with stdin and an environment of its own (nil: the
// process's), and returns exit code, stdout and stderr.
func cliEnv(t *testing.T, stdin *os.File, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	s := streams{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: os.Getenv}
	if stdin != nil {
		s.stdin = stdin
	}
	if env != nil {
		s.getenv = func(k string) string { return env[k] }
	}
	code := runWith(context.Background(), s, args)
	return code, stdout.String(), stderr.String()
}

func TestVersion(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv(envDSN, "")
	code, out, errOut := cli(t, "version", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.NotEmpty(t, rep["version"])
	require.Equal(t, runtime.Version(), rep["go_version"])
	require.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, rep["platform"])
	require.NotEmpty(t, rep["library_version"])
	require.EqualValues(t, migrations.Latest(), rep["schema_version"])
	require.NotContains(t, rep, "database", "no connection string, no database")

	db := env.DB(t)
	code, out, errOut = cli(t, "version", "--dsn", db.URL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, fmt.Sprintf("schema (database)    %d", migrations.Latest()))
	require.Contains(t, out, "go                   "+runtime.Version())

	code, out, errOut = cli(t, "version", "--dsn", env.EmptyDB(t).URL, "-o", "yaml")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "database:\n  schema_version: 0\n")

	code, out, errOut = cli(t, "version", "--dsn", "postgres://x@127.0.0.1:1/db?connect_timeout=2")
	require.Equal(t, exitError, code)
	require.Contains(t, out, "version", "the CLI's own version is printed anyway")
	require.Contains(t, errOut, "cannot reach PostgreSQL")
}

// Errors carry one "pgbaton:" prefix, also when the library's or the
// schema's message starts with one.
func TestErrorPrefixOnce(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	// An object pgbaton did not create keeps `migrate down` from dropping
	// the schema; the library says so with a message of its own.
	_, err := db.Pool(t).Exec(ctx, `CREATE TABLE pgbaton.not_ours (x int)`)
	require.NoError(t, err)
	code, _, errOut := cli(t, "migrate", "down", "--yes", "--dsn", db.URL)
	require.Equal(t, exitError, code)
	require.True(t, strings.HasPrefix(errOut, "pgbaton: "), errOut)
	require.Equal(t, 1, strings.Count(errOut, "pgbaton:"), "one prefix: %q", errOut)

	require.Equal(t, "server is a standby", errorLine(fmt.Errorf("pgbaton: server is a standby")))
	require.Equal(t, "migrate: server is a standby", errorLine(fmt.Errorf("migrate: pgbaton: server is a standby")))
}

// JSON and YAML carry 64-bit integers (keys, tokens, ids) as strings: a
// consumer that parses numbers as doubles (JavaScript, jq) would round a
// key above 2^53.
func TestSixtyFourBitIntegersAsStrings(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	holder := pgtest.Connect(t, db.URL, "big-key-holder")
	const big = int64(1<<53 + 1) // 9007199254740993: a double rounds it to ...992
	_, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, big)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT pgbaton.try_acquire('lease:big', 'w', 600000)`)
	require.NoError(t, err)

	code, out, errOut := cli(t, "locks", "--dsn", db.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var asJS struct {
		Advisory []map[string]any `json:"advisory"`
		Leases   []map[string]any `json:"leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &asJS)) // numbers become float64, as in JavaScript
	require.Equal(t, "9007199254740993", asJS.Advisory[0]["key"])
	require.IsType(t, "", asJS.Leases[0]["token"])

	code, out, errOut = cli(t, "locks", "--dsn", db.URL, "-o", "yaml")
	require.Equal(t, exitOK, code, errOut)
	var asYAML map[string][]map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(out), &asYAML))
	require.Equal(t, "9007199254740993", asYAML["advisory"][0]["key"])
	require.Equal(t, "big-key-holder", asYAML["advisory"][0]["application_name"])
	require.Contains(t, out, "advisory:\n  - lock: \"9007199254740993\"\n", "block style, indented")
}

// Connected to a standby, every command says so on stderr: its pg_locks
// shows none of the primary's locks.
func TestStandbyWarning(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	ctx := context.Background()
	d := env.DB(t)
	holder := pgtest.Connect(t, d.URL, "primary-holder")
	_, err := holder.Exec(ctx, `SELECT pg_advisory_lock(11)`)
	require.NoError(t, err)
	_, err = env.AdminPool().Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, env.Cluster())
	url := standby.URL(d.Name)
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		code, _, errOut := cli(t, "locks", "--dsn", url)
		if code != exitOK {
			t.Log(errOut)
		}
		return code == exitOK, nil
	}, "standby accepts connections to %s", d.Name)

	code, out, errOut := cli(t, "locks", "--dsn", url)
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "primary-holder", "a standby sees none of the primary's advisory locks")
	require.Contains(t, errOut, "warning: connected to a standby")
	require.Contains(t, errOut, "connect to the primary")

	// The wait queues are in an unlogged table, which a standby cannot
	// read: locks --waiting says so and shows the rest, leases --waiting
	// fails with the same advice.
	code, out, errOut = cli(t, "locks", "--dsn", url, "--waiting", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "lease waiters are not shown: a standby cannot read them")
	require.NotContains(t, out, "lease_waiters")
	code, _, errOut = cli(t, "leases", "--dsn", url, "--waiting")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "this server is a standby, which cannot read pgbaton's unlogged tables")

	code, _, errOut = cli(t, "locks", "--dsn", d.URL)
	require.Equal(t, exitOK, code)
	require.NotContains(t, errOut, "standby", "no warning on the primary")
}

// Lists cut at --limit say so on stderr (stdout stays parseable) with the
// flag that shows the next page, and that page continues where the first
// stopped.
func TestListsSayWhenCutAndPage(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	pool := db.Pool(t)
	for _, sql := range []string{
		`SELECT pgbaton.try_acquire('lease:' || i, 'w', 600000) FROM generate_series(1, 3) i`,
		`INSERT INTO pgbaton.job_run (job, owner, token) SELECT 'job-' || i, 'w', i FROM generate_series(1, 3) i`,
		`INSERT INTO pgbaton.event (action, target, reason) SELECT 'force_release_lease', 'lease:' || i, 'r' FROM generate_series(1, 3) i`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	names := func(out string) []string {
		var rows []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &rows))
		var got []string
		for _, r := range rows {
			for _, k := range []string{"name", "job", "target"} {
				if v, ok := r[k]; ok {
					got = append(got, v.(string))
					break
				}
			}
		}
		return got
	}

	code, out, errOut := cli(t, "leases", "--dsn", db.URL, "--limit", "2", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, []string{"lease:1", "lease:2"}, names(out))
	require.Contains(t, errOut, "showing the first 2 leases; there are more")
	require.Contains(t, errOut, "--after lease:2")
	code, out, errOut = cli(t, "leases", "--dsn", db.URL, "--limit", "2", "--after", "lease:2", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, []string{"lease:3"}, names(out))
	require.Empty(t, errOut, "the last page says nothing")

	code, out, errOut = cli(t, "runs", "--dsn", db.URL, "--limit", "2", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, []string{"job-3", "job-2"}, names(out))
	var runs []runView
	require.NoError(t, json.Unmarshal([]byte(out), &runs))
	require.Contains(t, errOut, fmt.Sprintf("--before %d", runs[1].ID))
	code, out, _ = cli(t, "runs", "--dsn", db.URL, "--limit", "2", "--before", fmt.Sprint(runs[1].ID), "-o", "json")
	require.Equal(t, exitOK, code)
	require.Equal(t, []string{"job-1"}, names(out))

	code, out, errOut = cli(t, "events", "--dsn", db.URL, "--limit", "1", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, []string{"lease:3"}, names(out))
	require.Contains(t, errOut, "showing the newest 1 events; there are older ones")

	code, _, errOut = cli(t, "locks", "--dsn", db.URL, "--limit", "1")
	require.Equal(t, exitOK, code)
	require.Contains(t, errOut, "showing the first 1 leases")

	// The old silent cut: --all stops at --limit no longer without a word.
	code, _, errOut = cli(t, "leases", "--dsn", db.URL, "--all", "--limit", "3")
	require.Equal(t, exitOK, code)
	require.Empty(t, errOut)
}

// Shell completion of lock and lease names comes from the database.
func TestCompletionFromTheDatabase(t *testing.T) {
	ctx := context.Background()
	db := env.DB(t)
	pool := db.Pool(t)
	for _, sql := range []string{
		`SELECT pgbaton.try_acquire('lease:alpha', 'w', 600000)`,
		`SELECT pgbaton.register('shards', ARRAY['shard-0', 'shard-1'])`,
		`INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('lease:advisory'), 'lease:advisory')`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	complete := func(args ...string) []string {
		t.Helper()
		code, out, errOut := cli(t, append([]string{cobra.ShellCompRequestCmd, "--dsn", db.URL}, args...)...)
		require.Equal(t, exitOK, code, errOut)
		return strings.Split(strings.TrimSpace(out), "\n")
	}
	require.Equal(t, []string{"lease:advisory", "lease:alpha", ":4"}, complete("release", "lease:"), "lease and advisory names; no files")
	require.Equal(t, []string{"shard-0", "shard-1", ":4"}, complete("release", "sh"))
	require.Equal(t, []string{":4"}, complete("release", "shard-0", ""), "one NAME only")
	require.Equal(t, []string{"shards", ":4"}, complete("leases", "--group", ""))
	require.Equal(t, []string{"shard-1", ":4"}, complete("leases", "--group", "shards", "--prefix", "shard-1"))
	require.Equal(t, []string{"held", "expired", "lock-delay", "free", "all", ":4"}, complete("leases", "--state", ""))

	// A database that cannot be reached completes nothing, quickly.
	code, out, _ := cli(t, cobra.ShellCompRequestCmd, "--dsn", "postgres://x@127.0.0.1:1/db", "release", "")
	require.Equal(t, exitOK, code)
	require.Equal(t, ":5", strings.TrimSpace(out), "error, no file completion")

	for shell, want := range map[string]string{"bash": "__start_pgbaton", "zsh": "#compdef pgbaton", "fish": "complete -c pgbaton"} {
		code, out, errOut := cli(t, "completion", shell)
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, want, shell)
	}
}

// Every command's help has examples.
func TestEveryCommandHasExamples(t *testing.T) {
	root := newRootCmd(streams{stdin: strings.NewReader(""), stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}, getenv: os.Getenv})
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.Name() == "completion" || (c.HasParent() && c.Parent().Name() == "completion") || !c.IsAvailableCommand() && c != root {
			return // cobra's own, and help topics
		}
		require.NotEmpty(t, c.Example, "%s has no examples", c.CommandPath())
		checked++
	}
	walk(root)
	require.GreaterOrEqual(t, checked, 13)
	code, out, _ := cli(t, "release", "--help")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "Examples:\n  pgbaton release")
	code, out, _ = cli(t, "leases", "--help")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "--prefix string   only leases whose name starts with this")
}

// The connection and output come from PGBATON_* and libpq's variables,
// documented in one help topic.
func TestEnvironment(t *testing.T) {
	db := env.DB(t)
	code, out, errOut := cliEnv(t, nil, map[string]string{envDSN: db.URL, envOutput: "json", "DATABASE_URL": "postgres://x@127.0.0.1:1/wrong"}, "status")
	require.Equal(t, exitOK, code, errOut)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "PGBATON_OUTPUT=json")
	require.Equal(t, db.Name, rep.Database, "PGBATON_DSN before DATABASE_URL")

	code, _, errOut = cliEnv(t, nil, map[string]string{envOutput: "xml"}, "status", "--dsn", db.URL)
	require.Equal(t, exitUsage, code, errOut)

	// libpq's variables, as pgx reads them, for what the DSN leaves out.
	t.Setenv("PGAPPNAME", "oncall-laptop")
	g := &globals{dsn: db.URL, streams: streams{getenv: os.Getenv}}
	pool, err := g.connect(context.Background())
	require.NoError(t, err)
	defer pool.Close()
	var app string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting('application_name')`).Scan(&app))
	require.Equal(t, "oncall-laptop", app, "PGAPPNAME wins over the CLI's default")

	code, out, _ = cli(t, "help", "environment")
	require.Equal(t, exitOK, code)
	for _, v := range []string{"PGHOST", "PGPASSFILE", "PGSERVICE", "PGSSLMODE", "PGTARGETSESSIONATTRS", envDSN, envOutput, envAdminToken, "NO_COLOR"} {
		require.Contains(t, out, v)
	}
}
