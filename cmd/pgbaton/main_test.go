package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

// cli runs the CLI in-process and returns exit code, stdout and stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestStatusJSON(t *testing.T) {
	db := env.DB(t)
	code, out, errOut := cli(t, "status", "--dsn", db.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, migrations.Latest(), rep.SchemaVersion)
	require.Equal(t, db.Name, rep.Database)
	require.False(t, rep.Standby)
	require.Positive(t, rep.LockTableCap)
	require.Empty(t, rep.Warnings)
}

func TestStatusWarnsWhenUnmigrated(t *testing.T) {
	db := env.EmptyDB(t)
	code, out, errOut := cli(t, "status", "--dsn", db.URL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "schema version  0")
	require.Contains(t, out, "pgbaton migrate up")
}

func TestMigrateUpAndVersion(t *testing.T) {
	db := env.EmptyDB(t)
	code, out, errOut := cli(t, "migrate", "up", "--dsn", db.URL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "schema at version")
	code, out, _ = cli(t, "migrate", "version", "--dsn", db.URL, "-o", "json")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, `"dirty": false`)
	code, _, errOut = cli(t, "migrate", "down", "--dsn", db.URL)
	require.Equal(t, exitUsage, code, "down without --yes")
	require.Contains(t, errOut, "--yes")
	code, _, errOut = cli(t, "migrate", "down", "--yes", "--dsn", db.URL)
	require.Equal(t, exitOK, code, errOut)
	code, _, errOut = cli(t, "migrate", "up", "--dsn", db.URL)
	require.Equal(t, exitOK, code, errOut)
	code, _, errOut = cli(t, "migrate", "down", "-y", "--dsn", db.URL)
	require.Equal(t, exitOK, code, "-y as release takes it: %s", errOut)
}

func TestErrorsAndExitCodes(t *testing.T) {
	code, _, errOut := cli(t, "status", "--dsn", "postgres://x@127.0.0.1:1/db?connect_timeout=2")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "cannot reach PostgreSQL at 127.0.0.1:1")
	require.Equal(t, 1, bytes.Count([]byte(errOut), []byte("\n")), "one actionable line: %q", errOut)

	code, _, errOut = cli(t, "status", "--dsn", "postgres://%zz")
	require.Equal(t, exitUsage, code, errOut)

	code, _, _ = cli(t, "status", "-o", "xml")
	require.Equal(t, exitUsage, code)
	code, _, _ = cli(t, "no-such-command")
	require.Equal(t, exitUsage, code)
	code, _, _ = cli(t, "status", "--no-such-flag")
	require.Equal(t, exitUsage, code)

	db := env.DB(t)
	code, _, errOut = cli(t, "status", "--dsn", db.URL+"&dbname=nope")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "does not exist")
}

func TestStatusWarnsBehindATransactionPooler(t *testing.T) {
	db := env.DB(t)
	direct := statusJSON(t, db.URL)
	require.Empty(t, direct.Warnings)

	// The CLI's pool prepares statements; PgBouncer 1.18 in transaction
	// mode keeps none across transactions, so talk to it in the simple
	// protocol as an application behind it must.
	bouncer := pgtest.StartPgBouncer(t, db) + "&default_query_exec_mode=simple_protocol"
	rep := statusJSON(t, bouncer)
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], "transaction pooler")
}

func statusJSON(t *testing.T, url string) statusReport {
	t.Helper()
	code, out, errOut := cli(t, "status", "--dsn", url, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	return rep
}

// Every command that talks to the database opens its pool through
// globals.withPool, which closes it whether the command's body succeeds or
// fails: no command leaves a session behind.
func TestEveryCommandClosesItsConnections(t *testing.T) {
	db := env.DB(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"status"}, exitOK},
		{[]string{"locks"}, exitOK},
		{[]string{"leases", "--all"}, exitOK},
		{[]string{"runs"}, exitOK},
		{[]string{"events"}, exitOK},
		{[]string{"watch", "--count", "1", "--interval", "10ms"}, exitOK},
		{[]string{"migrate", "version"}, exitOK},
		{[]string{"migrate", "up"}, exitOK},
		{[]string{"release", "no-such-lock", "--reason", "test", "--yes"}, exitNotFound},
		{[]string{"serve", "--listen", "256.0.0.1:1"}, exitError}, // connects, then cannot listen
	} {
		code, _, errOut := cli(t, append(tc.args, "--dsn", db.URL)...)
		require.Equal(t, tc.code, code, "%q: %s", tc.args, errOut)
		env.NoConnections(t, db)
	}
}
