package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// fixture holds known locks: two advisory locks and a pair on one session,
// a waiter on the first, and two held leases of which one is in a group.
type fixture struct {
	db     *pgtest.DB
	holder *pgx.Conn
	pids   map[uint32]string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	d := env.DB(t)
	holder := pgtest.Connect(t, d.URL, "golden-holder")
	for _, sql := range []string{
		`INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('job:golden'), 'job:golden')`,
		`SELECT pg_advisory_lock(pgbaton.advisory_key('job:golden'))`,
		`SELECT pg_advisory_lock(-5)`,
		`SELECT pg_advisory_lock_shared(7, -8)`,
		`SELECT pgbaton.try_acquire('lease:alpha', 'worker-1', 600000)`,
		`SELECT pgbaton.register('shards', ARRAY['shard-0', 'shard-1'])`,
		`SELECT pgbaton.claim('shards', 'worker-2', 1, 600000)`,
	} {
		_, err := holder.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// Blocks until the holder's session ends or the test does.
	waiterPID := pgtest.Blocked(t, d.URL, "golden-waiter", `SELECT pg_advisory_lock(pgbaton.advisory_key('job:golden'))`)
	return &fixture{db: d, holder: holder, pids: map[uint32]string{
		holder.PgConn().PID(): "HOLDER_PID", waiterPID: "WAITER_PID"}}
}

var (
	reDuration = regexp.MustCompile(`\b\d+(\.\d+)?(ms|s|m[0-9.]+s|h[0-9]+m0s|m0s)\b`)
	reTime     = regexp.MustCompile(`\d{4}-\d\d-\d\dT[0-9:.]+Z`)
	reClient   = regexp.MustCompile(`127\.0\.0\.1`)
	reMillis   = regexp.MustCompile(`(waiting_ms"?: )\d+`)
)

// normalize replaces what changes between runs (pids, times, durations).
func (f *fixture) normalize(s string) string {
	for pid, placeholder := range f.pids {
		s = regexp.MustCompile(`\b`+strconv.Itoa(int(pid))+`\b`).ReplaceAllString(s, placeholder)
	}
	s = reTime.ReplaceAllString(s, "TIME")
	s = reDuration.ReplaceAllString(s, "DUR")
	s = reClient.ReplaceAllString(s, "CLIENT")
	s = reMillis.ReplaceAllString(s, "${1}MS")
	// Columns widen with the values replaced above: compare words, not
	// spacing.
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}

func (f *fixture) golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	got = f.normalize(got)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -update to create %s", path)
	require.Equal(t, string(want), got)
}

func TestLocksGolden(t *testing.T) {
	f := newFixture(t)
	for _, output := range []string{"table", "wide", "json", "yaml"} {
		code, out, errOut := cli(t, "locks", "--dsn", f.db.URL, "-o", output)
		require.Equal(t, exitOK, code, errOut)
		f.golden(t, "locks-"+output, out)
	}
	code, out, errOut := cli(t, "leases", "--dsn", f.db.URL, "--all", "--group", "shards", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	f.golden(t, "leases-group-json", out)
	var leases []leaseView
	require.NoError(t, json.Unmarshal([]byte(out), &leases))
	require.Len(t, leases, 2)

	f.waitInQueues(t)
	code, out, errOut = cli(t, "locks", "--dsn", f.db.URL, "--waiting")
	require.Equal(t, exitOK, code, errOut)
	f.golden(t, "locks-waiting", out)
	code, out, errOut = cli(t, "locks", "--dsn", f.db.URL, "--waiting", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	f.golden(t, "locks-waiting-json", out)
	for _, output := range []string{"table", "wide", "json", "yaml"} {
		code, out, errOut := cli(t, "leases", "--dsn", f.db.URL, "--waiting", "-o", output)
		require.Equal(t, exitOK, code, errOut)
		f.golden(t, "leases-waiting-"+output, out)
	}
}

// waitInQueues registers three waiters that live a minute: two in the
// queue of lease:alpha, one in the queue of group shards, and one whose
// lease session expired at once, which is in no queue.
func (f *fixture) waitInQueues(t *testing.T) {
	t.Helper()
	pool := f.db.Pool(t)
	for _, sql := range []string{
		`SELECT pgbaton.wait_for('lease:alpha', 'ghost/1', false, NULL, 1)`,
		`SELECT pgbaton.wait_for('shards', 'worker-5/1', true)`,
		`SELECT pgbaton.wait_for('lease:alpha', 'worker-3/1')`,
		`SELECT pgbaton.wait_for('lease:alpha', 'worker-4/7')`,
	} {
		_, err := pool.Exec(context.Background(), sql)
		require.NoError(t, err, sql)
	}
	time.Sleep(5 * time.Millisecond) // the ghost's lease session expires
}

// leases --waiting lists the wait queues by name and position; --holder
// matches the owner or the waiter, --prefix the name, and --limit cuts.
func TestLeaseWaitersQueue(t *testing.T) {
	f := newFixture(t)
	f.waitInQueues(t)
	waiters := func(args ...string) ([]waiterView, string) {
		t.Helper()
		code, out, errOut := cli(t, append([]string{"leases", "--dsn", f.db.URL, "--waiting", "-o", "json"}, args...)...)
		require.Equal(t, exitOK, code, errOut)
		var views []waiterView
		require.NoError(t, json.Unmarshal([]byte(out), &views))
		return views, errOut
	}
	place := func(views []waiterView) []string {
		var got []string
		for _, v := range views {
			got = append(got, fmt.Sprintf("%s %t %d %s %s", v.Name, v.Group, v.Position, v.Owner, v.Waiter))
		}
		return got
	}
	all, _ := waiters()
	require.Equal(t, []string{
		"lease:alpha false 1 worker-3 worker-3/1",
		"lease:alpha false 2 worker-4 worker-4/7",
		"shards true 1 worker-5 worker-5/1",
	}, place(all))
	for _, v := range all {
		require.GreaterOrEqual(t, v.WaitingMs, int64(0))
		require.NotEmpty(t, v.Since)
	}
	got, _ := waiters("--holder", "WORKER-4")
	require.Equal(t, []string{"lease:alpha false 2 worker-4 worker-4/7"}, place(got))
	got, _ = waiters("--prefix", "sh")
	require.Equal(t, []string{"shards true 1 worker-5 worker-5/1"}, place(got))
	got, errOut := waiters("--limit", "1")
	require.Equal(t, []string{"lease:alpha false 1 worker-3 worker-3/1"}, place(got))
	require.Contains(t, errOut, "showing the first 1 lease waiters; there are more")

	code, out, errOut := cli(t, "watch", "--dsn", f.db.URL, "--waiting", "--count", "1", "--interval", "10ms")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "advisory: 1 held, 1 contended, 1 sessions waiting; leases: 3 waiters")
	require.Contains(t, out, "worker-4/7")
}

func TestReleaseLeaseIsAuditedAndFencesTheOldHolder(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	pool := f.db.Pool(t)
	var oldToken int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT token FROM pgbaton.lease WHERE name = 'lease:alpha'`).Scan(&oldToken))

	code, _, errOut := cli(t, "release", "lease:alpha", "--dsn", f.db.URL, "--yes")
	require.Equal(t, exitUsage, code, "no reason")
	require.Contains(t, errOut, "--reason is required")

	code, _, errOut = cli(t, "release", "lease:alpha", "--dsn", f.db.URL, "--reason", "worker-1 is wedged")
	require.Equal(t, exitUsage, code, "no confirmation without a terminal")
	require.NotContains(t, errOut, "fail.:", "the question is not glued to the explanation")
	require.Contains(t, errOut, "nothing was changed; pass --yes")

	code, out, errOut := cli(t, "release", "lease:alpha", "--dsn", f.db.URL, "--reason", "worker-1 is wedged", "--yes", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var res struct {
		OldToken int64 `json:"old_token,string"`
		NewToken int64 `json:"new_token,string"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, oldToken, res.OldToken)
	require.Greater(t, res.NewToken, oldToken)

	// The old holder can no longer renew, release or pass the fence.
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgbaton.renew('lease:alpha', 'worker-1', $1, 1000)`, oldToken).Scan(&n))
	require.Zero(t, n)

	code, out, errOut = cli(t, "events", "--dsn", f.db.URL, "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var events []eventView
	require.NoError(t, json.Unmarshal([]byte(out), &events))
	require.Len(t, events, 1)
	require.Equal(t, "force_release_lease", events[0].Action)
	require.Equal(t, "lease:alpha", events[0].Target)
	require.Equal(t, "worker-1 is wedged", events[0].Reason)
	require.Equal(t, "postgres", events[0].Actor)
	require.Equal(t, oldToken, *events[0].OldToken)
	require.Equal(t, res.NewToken, *events[0].NewToken)

	code, _, errOut = cli(t, "release", "lease:alpha", "--dsn", f.db.URL, "--reason", "again", "--yes")
	require.Equal(t, exitNotFound, code, errOut)
}

// A lease taken with a lock-delay: a forced release keeps the delay (the
// leases list shows it, in JSON too) unless --clear-lock-delay, which also
// ends a lock-delay under way.
func TestReleaseLeaseKeepsOrClearsItsLockDelay(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	pool := f.db.Pool(t)
	_, err := pool.Exec(ctx, `SELECT pgbaton.lease_attempt('lease:delayed', 'worker-5', 60000, p_lock_delay_ms => 60000)`)
	require.NoError(t, err)

	code, out, errOut := cli(t, "release", "lease:delayed", "--dsn", f.db.URL, "--reason", "wedged", "--yes", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "its lock-delay was kept: nobody is granted it for 1m0s")
	var res struct {
		FreeAt time.Time `json:"free_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.WithinDuration(t, time.Now().Add(time.Minute), res.FreeAt, 10*time.Second)

	code, out, errOut = cli(t, "leases", "--dsn", f.db.URL, "--state", "lock-delay", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var views []leaseView
	require.NoError(t, json.Unmarshal([]byte(out), &views))
	require.Len(t, views, 1)
	require.Equal(t, "lock-delay", views[0].State)
	require.Equal(t, "worker-5", views[0].Owner, "the owner that lost it")
	until, err := time.Parse(time.RFC3339Nano, views[0].LockDelayUntil)
	require.NoError(t, err)
	require.WithinDuration(t, res.FreeAt, until, time.Millisecond)
	code, out, _ = cli(t, "leases", "--dsn", f.db.URL, "--state", "lock-delay")
	require.Equal(t, exitOK, code)
	require.Regexp(t, `lease:delayed\s+-\s+lock-delay\s+worker-5\s+\d+\s+delay (1m0s|5\ds)`, out)

	code, _, errOut = cli(t, "release", "lease:delayed", "--dsn", f.db.URL, "--reason", "again", "--yes")
	require.Equal(t, exitNotFound, code, "not held: %s", errOut)
	code, _, errOut = cli(t, "release", "lease:delayed", "--dsn", f.db.URL, "--reason", "clear it", "--yes", "--clear-lock-delay")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "in lock-delay until")
	require.NotContains(t, errOut, "was kept")
	var free bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT owner IS NULL AND lock_delay_until IS NULL FROM pgbaton.lease_status WHERE name = 'lease:delayed'`).Scan(&free))
	require.True(t, free)
}

func TestReleaseAdvisoryTerminatesOnlyWhenAsked(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	pool := f.db.Pool(t)
	holderPid := f.holder.PgConn().PID()

	code, _, errOut := cli(t, "release", "job:golden", "--dsn", f.db.URL, "--reason", "stuck", "--yes")
	require.Equal(t, exitUsage, code, "a missing flag is a usage error, as everywhere else")
	require.Contains(t, errOut, "--terminate-backend")
	require.Contains(t, errOut, "(7,-8)", "shows what else the backend holds")
	require.Contains(t, errOut, "-5")

	// Standard input is not a terminal (tests, scripts, CI): no question
	// is asked, and nothing happens without --yes.
	code, _, errOut = cli(t, "release", "job:golden", "--dsn", f.db.URL, "--reason", "stuck", "--terminate-backend")
	require.Equal(t, exitUsage, code, "no confirmation without a terminal")
	require.Contains(t, errOut, "standard input is not a terminal")
	require.Contains(t, errOut, "nothing was changed; pass --yes")
	require.NotContains(t, errOut, "?:", "the question is not glued to the explanation")
	require.NotContains(t, errOut, ".:", "the question is not glued to the explanation")
	require.NotContains(t, errOut, "[y/N]", "nothing was asked")
	require.NoError(t, f.holder.Ping(ctx), "the holder is alive")

	code, _, errOut = cli(t, "release", "job:golden", "--dsn", f.db.URL, "--reason", "stuck", "--terminate-backend", "--yes")
	require.Equal(t, exitOK, code, errOut)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(holderPid)).Scan(&n)
		return n == 0, err
	}, "holder backend still alive")
	var detail string
	require.NoError(t, pool.QueryRow(ctx, `SELECT detail::text FROM pgbaton.event WHERE action = 'terminate_advisory_holder'`).Scan(&detail))
	require.Contains(t, detail, `"application_name": "golden-holder"`)

	code, _, _ = cli(t, "release", "no-such-lock", "--dsn", f.db.URL, "--reason", "x", "--yes")
	require.Equal(t, exitNotFound, code)
}

func TestReaderCannotRelease(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	pool := f.db.Pool(t)
	role := "reader_" + strings.TrimPrefix(f.db.Name, "pgbaton_t")
	_, err := pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN IN ROLE pgbaton_reader")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = env.AdminPool().Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = env.AdminPool().Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	cfg, err := pgx.ParseConfig(f.db.URL)
	require.NoError(t, err)
	readerURL := strings.Replace(f.db.URL, cfg.User+"@", role+"@", 1)

	code, out, errOut := cli(t, "locks", "--dsn", readerURL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "lease:alpha")

	code, _, errOut = cli(t, "release", "lease:alpha", "--dsn", readerURL, "--reason", "try", "--yes")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "needs role pgbaton_admin")
	var owner string
	require.NoError(t, pool.QueryRow(ctx, `SELECT owner FROM pgbaton.lease WHERE name = 'lease:alpha'`).Scan(&owner))
	require.Equal(t, "worker-1", owner, "the lease is untouched")
}

func TestWatchAndRuns(t *testing.T) {
	f := newFixture(t)
	code, out, errOut := cli(t, "watch", "--dsn", f.db.URL, "--count", "2", "--interval", "10ms")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, 2, strings.Count(out, "pgbaton watch"))
	require.Contains(t, out, "advisory: 3 held, 1 contended, 1 sessions waiting; leases: 2 held")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		var sink strings.Builder
		done <- run(ctx, []string{"watch", "--dsn", f.db.URL, "--interval", "10ms"}, &sink, &sink)
	}()
	cancel() // Ctrl-C
	select {
	case code := <-done:
		require.Equal(t, exitOK, code, "Ctrl-C is a clean exit")
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not stop on cancel")
	}

	code, out, errOut = cli(t, "runs", "--dsn", f.db.URL)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "CHECKPOINT")
}

func TestUnmigratedSchemaIsOneActionableLine(t *testing.T) {
	d := env.EmptyDB(t)
	for _, cmd := range []string{"locks", "leases", "runs", "events"} {
		code, _, errOut := cli(t, cmd, "--dsn", d.URL)
		require.Equal(t, exitError, code, cmd)
		require.Contains(t, errOut, "pgbaton migrate up", cmd)
		require.Equal(t, 1, strings.Count(errOut, "\n"), cmd)
	}
}
