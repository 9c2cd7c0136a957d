package leasetable_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// A queue that drained, was vacuumed and fills again in a burst has
// statistics that describe a table of a few rows on many pages: the
// planner then sized 10k fresh work items as 8 rows and claim scanned the
// whole table on every call (bench/ measured 2-4x fewer items/s). The
// protocol functions must stay on their indexes whatever the statistics
// say: the table's seq_scan counter must not move while they run.
func TestClaimStaysOnIndexesWithStaleStatistics(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 60*time.Second)
	conn := pgtest.Connect(t, d.URL, "plans")
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	const items = 4000
	names := func(round int) []string {
		ns := make([]string, items)
		for i := range ns {
			ns[i] = fmt.Sprintf("item-%d-%d", round, i)
		}
		return ns
	}
	// A burst of items, then a few standalone leases behind them (so that
	// VACUUM cannot cut the emptied pages off the end), then the burst
	// worked off and the table vacuumed: 8 live rows on many pages.
	exec("SELECT pgbaton.register('q', $1)", names(1))
	for i := range 8 {
		exec("SELECT pgbaton.try_acquire($1, 'solo', 60000)", fmt.Sprintf("solo-%d", i))
	}
	exec("DELETE FROM pgbaton.lease WHERE lease_group = 'q'")
	exec("VACUUM (ANALYZE) pgbaton.lease")
	var reltuples float64
	var relpages int
	require.NoError(t, conn.QueryRow(ctx,
		"SELECT reltuples, relpages FROM pg_class WHERE oid = 'pgbaton.lease'::regclass").Scan(&reltuples, &relpages))
	require.LessOrEqual(t, reltuples, 8.0, "premise: statistics of a nearly empty table")
	require.GreaterOrEqual(t, relpages, 20, "premise: on many pages")

	// The next burst lands in the free space: the table's size on disk no
	// longer tells the planner anything either.
	exec("SELECT pgbaton.register('q', $1)", names(2))

	// The counters are read once the connection that did the work has
	// closed (see pgtest.WaitTableStats).
	require.NoError(t, conn.Close(ctx))
	stats := d.Pool(t)
	before := pgtest.WaitTableStats(t, stats, "pgbaton.lease", func(s pgtest.TableStats) bool {
		return s.Inserted >= 2*items+8 && s.Deleted >= items
	})
	conn = pgtest.Connect(t, d.URL, "plans")

	claim := func(n int) (ns []string, ts []int64) {
		t.Helper()
		rows, err := conn.Query(ctx, "SELECT name, token FROM pgbaton.claim('q', 'w', $1, 60000)", n)
		require.NoError(t, err)
		type granted struct {
			Name  string
			Token int64
		}
		gs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[granted])
		require.NoError(t, err)
		require.Len(t, gs, n)
		for _, g := range gs {
			ns, ts = append(ns, g.Name), append(ts, g.Token)
		}
		return ns, ts
	}
	for range 20 { // past plpgsql's switch to a cached generic plan
		ns, ts := claim(10)
		var deleted []string
		rows, err := conn.Query(ctx, "SELECT pgbaton.complete_many($1, $2, 'w')", ns[1:], ts[1:])
		require.NoError(t, err)
		deleted, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Len(t, deleted, len(ns)-1)
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT pgbaton.complete($1, 'w', $2)", ns[0], ts[0]).Scan(&ok))
		require.True(t, ok)
	}
	require.NoError(t, conn.Close(ctx))
	const completed = 20 * 10
	after := pgtest.WaitTableStats(t, stats, "pgbaton.lease", func(s pgtest.TableStats) bool {
		return s.Deleted-before.Deleted >= completed
	})
	assert.Greater(t, after.IdxScan, before.IdxScan, "the index scans were counted")
	assert.Equal(t, before.SeqScan, after.SeqScan, "sequential scans of pgbaton.lease by claim/complete")
}

// The epoch row is read by its key. The protocol functions run with
// enable_seqscan = off, so a seq scan of pgbaton.token_epoch (one row) is
// planned at the disabled cost of 10^10, which sends the query through
// JIT compilation: session_open took 130 ms and a fleet of 200 clients
// could not open its sessions. Counted with the backend's own statistics
// in one transaction.
func TestEpochReadByKey(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pool := env.DB(t).Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var session int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT id FROM pgbaton.session_open('o', 60000)").Scan(&session))
	for _, sql := range []string{
		"SELECT count(*) FROM pgbaton.session_keepalive($1, 60000)",
		"SELECT count(*) FROM pgbaton.lease_attempt('a', 'o', 60000, NULL, $1)",
		"SELECT pgbaton.register('g', ARRAY['i1', 'i2'])::bigint + $1 * 0",
		"SELECT count(*) FROM pgbaton.claim('g', 'o', 2, 60000, $1)",
		"SELECT pgbaton.sync_epoch() + $1 * 0",
	} {
		var n int64
		require.NoError(t, tx.QueryRow(ctx, sql, session).Scan(&n), sql)
	}
	var scans int64
	require.NoError(t, tx.QueryRow(ctx,
		"SELECT coalesce(seq_scan, 0) FROM pg_stat_xact_user_tables WHERE relid = 'pgbaton.token_epoch'::regclass").Scan(&scans))
	assert.Zero(t, scans, "seq scans of pgbaton.token_epoch")
}

// The functions that take leases by (name, token) arrays plan their join
// once per connection (force_generic_plan). Planned while the table was
// empty and vacuumed, as a drained queue is, the join hashed the arrays
// and read every row of pgbaton.lease through its primary key, on every
// call for the connection's life: claim batch 100 ran at 25-29k items/s
// where it otherwise ran 70-80k, in the runs whose connections had first
// completed on an empty table (bench/, AMD EPYC, 2 cores). Each must read
// only the rows it names, whatever the table looked like when it was
// planned: counted in the transaction's own statistics.
func TestLeaseArraysReadOnlyTheirRows(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 60*time.Second)
	setup := d.Pool(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := setup.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	const items = 4000
	names := make([]string, items)
	for i := range names {
		names[i] = fmt.Sprintf("item-%d", i)
	}
	// A queue drained and vacuumed.
	exec("SELECT pgbaton.register('q', $1)", names)
	exec("DELETE FROM pgbaton.lease")
	exec("VACUUM pgbaton.lease")

	var session int64
	require.NoError(t, setup.QueryRow(ctx, "SELECT id FROM pgbaton.session_open('w', 600000)").Scan(&session))
	calls := []string{
		"SELECT count(*) FROM pgbaton.complete_many($1, $2, 'w')",
		"SELECT count(*) FROM pgbaton.complete_tx($1, $2, 'w')",
		"SELECT count(*) FROM pgbaton.release_many($1, $2, 'w')",
		"SELECT count(*) FROM pgbaton.release_many($1, $2, 'w', $1)",
		"SELECT count(*) FROM pgbaton.held_grants($1, $2, 'w')",
		"SELECT count(*) FROM pgbaton.settle_many($1, $2, 'w')",
		"SELECT count(*) FROM pgbaton.session_lost($3, $1, $2, 'w')",
	}
	args := func(sql, name string, token int64) []any {
		if strings.Contains(sql, "$3") {
			return []any{[]string{name}, []int64{token}, session}
		}
		return []any{[]string{name}, []int64{token}}
	}
	// One connection plans each call on the empty table ...
	conn := pgtest.Connect(t, d.URL, "plans")
	for _, sql := range calls {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		var n int64
		// complete_tx raises on a name it does not find: planned all the same.
		_ = tx.QueryRow(ctx, sql, args(sql, "none", 1)...).Scan(&n)
		require.NoError(t, tx.Rollback(ctx))
	}
	// ... and runs it once the queue has filled again, on one lease each
	// time, rolled back.
	exec("SELECT pgbaton.register('q', $1)", names)
	var name string
	var token int64
	require.NoError(t, setup.QueryRow(ctx, "SELECT name, token FROM pgbaton.claim('q', 'w', 1, 600000, $1)", session).Scan(&name, &token))
	for _, sql := range calls {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		before := rowsRead(t, tx, "pgbaton.lease")
		var n int64
		require.NoError(t, tx.QueryRow(ctx, sql, args(sql, name, token)...).Scan(&n), sql)
		fetched := rowsRead(t, tx, "pgbaton.lease") - before
		require.NoError(t, tx.Rollback(ctx))
		assert.Less(t, fetched, int64(20), "%s read %d rows of pgbaton.lease for one lease", sql, fetched)
	}
}

// TestProtocolLocksStayOnTheFastPath: every call of a protocol function on
// a connection that has made it once takes its locks on the schema's
// tables and indexes on the backend's fast path (16 slots before
// PostgreSQL 18). A lock that does
// not fit goes to the shared lock table, whose partition lock every
// backend locking the same relation takes too: with 500 clients the
// grants, which all lock pgbaton.lease and its indexes, queued on it
// (pg_stat_activity: up to 29 backends at once waiting on LWLock
// LockManager in bench/'s fleet of 500). A statement planned afresh opens
// every index of every table it reads; a grant bound to a session and a
// waiter planned so for its first five calls on a connection (Postgres's
// custom plans), 20 relations, and a fleet's connections, each making a
// grant now and then, made few more calls than that.
func TestProtocolLocksStayOnTheFastPath(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 60*time.Second)
	setup := pgtest.Connect(t, d.URL, "fastpath-setup")
	var sid int64
	require.NoError(t, setup.QueryRow(ctx,
		"SELECT id FROM pgbaton.session_open('fp', 60000)").Scan(&sid))
	items := make([]string, 200)
	for i := range items {
		items[i] = fmt.Sprintf("fp-item-%d", i)
	}
	_, err := setup.Exec(ctx, "SELECT pgbaton.register('fp-group', $1)", items)
	require.NoError(t, err)

	conn := pgtest.Connect(t, d.URL, "fastpath")
	// Each call in a transaction of its own, which reports the schema's
	// tables and indexes it locked off the fast path (the question's own
	// catalog locks come last, when the slots may be full). Sequences are
	// left out: PostgreSQL 13 took the token sequence's lock off the fast
	// path at every grant, with 12 relations locked; the contention that
	// cost is on the tables and indexes every grant reads.
	offFastPath := func(call func(tx pgx.Tx) error) []string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		require.NoError(t, call(tx))
		rows, err := tx.Query(ctx, `SELECT DISTINCT l.relation::regclass::text FROM pg_locks l
			JOIN pg_class c ON c.oid = l.relation AND c.relkind IN ('r', 'i') AND c.relnamespace = 'pgbaton'::regnamespace
			WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND NOT l.fastpath ORDER BY 1`)
		require.NoError(t, err)
		rels, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return rels
	}
	exec := func(sql string, args ...any) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, sql, args...)
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		}
	}
	// One round of what a client does: a grant bound to its session as a
	// waiter, a refused look, a renewal, a release, a listener's
	// registration and wake-up, a registration of items, a claim, a
	// completion, a keep-alive.
	round := func(i int) map[string][]string {
		name := fmt.Sprintf("fp-lease-%d", i%3)
		var token int64
		grant := offFastPath(func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT token FROM pgbaton.lease_attempt($1, 'fp', 60000, NULL, $2, gen_random_uuid(), 'fp/w')`,
				name, sid).Scan(&token)
		})
		got := map[string][]string{
			"lease_attempt (grant)": grant,
			"lease_attempt (held)": offFastPath(exec(`SELECT * FROM pgbaton.lease_attempt($1, 'other', 60000, NULL, NULL, gen_random_uuid(), 'other/w')`,
				name)),
			"renew":             offFastPath(exec("SELECT * FROM pgbaton.renew($1, 'fp', $2, 60000)", name, token)),
			"release":           offFastPath(exec("SELECT * FROM pgbaton.release($1, 'fp', $2)", name, token)),
			"stop_waiting":      offFastPath(exec("SELECT pgbaton.stop_waiting($1, 'other/w')", name)),
			"wait_for":          offFastPath(exec("SELECT pgbaton.wait_for($1, 'fp/l', false, $2, 60000)", name, sid)),
			"notify_waiters":    offFastPath(exec("SELECT pgbaton.notify_waiters($1)", []string{name})),
			"stop_waiting (2)":  offFastPath(exec("SELECT pgbaton.stop_waiting($1, 'fp/l')", name)),
			"register":          offFastPath(exec("SELECT pgbaton.register('fp-group', $1)", []string{fmt.Sprintf("fp-new-%d", i)})),
			"session_keepalive": offFastPath(exec("SELECT * FROM pgbaton.session_keepalive($1, 60000)", sid)),
		}
		var names []string
		var tokens []int64
		got["claim"] = offFastPath(func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "SELECT name, token FROM pgbaton.claim('fp-group', 'fp', 2, 60000, $1, gen_random_uuid())", sid)
			if err != nil {
				return err
			}
			var n string
			var tok int64
			_, err = pgx.ForEachRow(rows, []any{&n, &tok}, func() error {
				names, tokens = append(names, n), append(tokens, tok)
				return nil
			})
			return err
		})
		got["complete_many"] = offFastPath(exec("SELECT pgbaton.complete_many($1, $2, 'fp')", names, tokens))
		return got
	}
	round(0) // plans each statement once
	for i := 1; i <= 6; i++ {
		for call, rels := range round(i) {
			assert.Empty(t, rels, "call %d of %s: relations locked off the fast path", i+1, call)
		}
	}
}

// A session keep-alive is the statement a fleet's server runs most (500
// clients: 38 % of the active backends sampled in a saturated window). It
// must be a HOT update: no index entry per keep-alive, so no contention on
// an index's rightmost page and one WAL record instead of three to four
// (an index on expires_at made every keep-alive a non-HOT update).
func TestKeepaliveIsHOT(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 60*time.Second)
	stats := d.Pool(t)
	before := pgtest.WaitTableStats(t, stats, "pgbaton.lease_session", func(pgtest.TableStats) bool { return true })
	conn := pgtest.Connect(t, d.URL, "plans")
	var sessions [3]int64
	for i := range sessions {
		require.NoError(t, conn.QueryRow(ctx, "SELECT id FROM pgbaton.session_open('o', 60000)").Scan(&sessions[i]))
	}
	const rounds = 20
	for range rounds {
		for _, s := range sessions {
			var n int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pgbaton.session_keepalive($1, 60000)", s).Scan(&n))
			require.Equal(t, 1, n, "kept alive")
		}
	}
	require.NoError(t, conn.Close(ctx))
	after := pgtest.WaitTableStats(t, stats, "pgbaton.lease_session", func(s pgtest.TableStats) bool {
		return s.Updated-before.Updated >= int64(rounds*len(sessions))
	})
	assert.Equal(t, after.Updated-before.Updated, after.HotUpdated-before.HotUpdated, "keep-alives that were HOT updates")
}

// A claim looks for the items of sessions that have ended, and must find
// those sessions without reading the live ones: a fleet has one session
// per client, and a claim that read every row paid 40-60ns per open
// session (500 sessions: 176-295µs a claim against 147-152µs; 5,000:
// 361-368µs against 143-157µs). Nor may the keep-alives that keep those
// sessions alive all update an index (TestKeepaliveIsHOT).
func TestClaimReadsNoLiveSession(t *testing.T) {
	d := env.DB(t)
	ctx := pgtest.Context(t, 60*time.Second)
	setup := d.Pool(t)
	const live = 300
	var session int64
	for range live {
		require.NoError(t, setup.QueryRow(ctx, "SELECT id FROM pgbaton.session_open('w', 600000)").Scan(&session))
	}
	_, err := setup.Exec(ctx, "SELECT pgbaton.register('q', ARRAY['a', 'b'])")
	require.NoError(t, err)
	conn := pgtest.Connect(t, d.URL, "plans")
	for i := range 3 { // the first calls plan afresh, the later ones not
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		before := rowsRead(t, tx, "pgbaton.lease_session")
		var n int
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pgbaton.claim('q', 'w', 1, 600000, $1)", session).Scan(&n))
		require.Equal(t, 1, n)
		fetched := rowsRead(t, tx, "pgbaton.lease_session") - before
		require.NoError(t, tx.Rollback(ctx))
		assert.Less(t, fetched, int64(10), "claim %d read %d session rows with %d sessions open", i, fetched, live)
	}
}

// rowsRead is how many rows of table tx's connection has read, by index
// or sequentially, in the transactions not yet reported to the
// statistics, tx's included.
func rowsRead(t *testing.T, tx pgx.Tx, table string) (n int64) {
	t.Helper()
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "+
		"FROM pg_stat_xact_user_tables WHERE relid = $1::regclass", table).Scan(&n))
	return n
}
