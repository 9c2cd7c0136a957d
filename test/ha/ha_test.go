//go:build ha

package ha

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/hacluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
	"github.com/pgbaton/pgbaton/test/check"
)

// nemesis is one fault the suite injects into the cluster while the
// workload runs.
type nemesis struct {
	name string
	// sync runs the phase with Patroni's synchronous_mode on: a commit is
	// acknowledged only once the synchronous standby has it, and only that
	// standby may be promoted.
	sync bool
	// lag stalls the leader's replication before the fault, so that the
	// replica promoted afterwards lacks acknowledged commits.
	lag bool
	// lossy: the leader dies while replication is asynchronous, so the
	// last commits it acknowledged may be missing on the new primary, as
	// asynchronous replication allows (in the lag phase they must be).
	lossy bool
	// inject applies the fault to the leader (other is a replica) and
	// reports whether it killed the leader's node.
	inject func(ctx context.Context, c *hacluster.Cluster, leader, other string) (killed bool, err error)
}

var nemeses = []nemesis{
	{name: "switchover", inject: func(ctx context.Context, c *hacluster.Cluster, leader, other string) (bool, error) {
		return false, c.Switchover(ctx, leader, other)
	}},
	{name: "failover", lossy: true, inject: killLeader},
	{name: "crash-restart", inject: func(ctx context.Context, c *hacluster.Cluster, leader, _ string) (bool, error) {
		_, err := c.KillPostgres(leader)
		return false, err
	}},
	{name: "failover-sync", sync: true, inject: killLeader},
	{name: "failover-async-lag", lag: true, lossy: true, inject: killLeader},
}

func killLeader(_ context.Context, c *hacluster.Cluster, leader, _ string) (bool, error) {
	return true, c.KillNode(leader)
}

// lagFor is how long the leader's replication is stalled before the
// fault in the lag phase, while the workload commits.
const lagFor = 3 * time.Second

// TestHA runs the workload through one multi-host URL against a real
// Patroni cluster and injects each nemesis in turn; after each it checks
// the history and prints one line:
//
//	ha: NEMESIS failover_ms F clients_ok_ms C (bound B) told_ms T (bound P) token X -> Y overlaps 0 stale_accepted 0 lost 0 doubled 0 items_lost 0 items_doubled 0 backwards 0 acked_lost N
//
// lost counts acknowledged writes lost where nothing may be lost;
// acked_lost counts them all, including those an asynchronous failover
// lost (allowed there; required in the lag phase).
func TestHA(t *testing.T) {
	ctx := pgtest.Context(t, 20*time.Minute)
	start := time.Now()
	c, err := hacluster.Start(ctx, hacluster.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes() {
				t.Logf("log of %s:\n%s", n.Name, c.LogTail(n.Name))
			}
		}
		assert.NoError(t, c.Stop())
		assert.Empty(t, c.Leftovers(), "processes left after Stop")
	})
	t.Logf("patroni cluster of %d nodes up in %s", len(c.Nodes()), time.Since(start).Round(time.Millisecond))

	admin := pgtest.Pool(t, c.URL("postgres"))
	_, err = admin.Exec(ctx, "CREATE DATABASE pgbaton")
	require.NoError(t, err)
	// pgx stops trying the other hosts of a URL when one answers that the
	// database does not exist: wait until every replica has replayed it,
	// as the leader sees them.
	var lsn string
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn))
	replicas := len(c.Nodes()) - 1
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn >= $1::pg_lsn", lsn).Scan(&n)
		return n == replicas, err
	}, "database pgbaton not replayed by the replicas (LSN %s)", lsn)
	admin.Close()
	url := c.URL("pgbaton")
	require.NoError(t, migrations.UpURL(ctx, url))
	pool := pgtest.Pool(t, url)
	_, err = pool.Exec(ctx, `CREATE TABLE ha_item_done (item text NOT NULL, token bigint NOT NULL, worker text NOT NULL)`)
	require.NoError(t, err)

	var lines []string
	for i, nm := range nemeses {
		t.Run(nm.name, func(t *testing.T) {
			res := runPhase(t, ctx, c, pool, i+1, nm)
			line := res.line(nm)
			lines = append(lines, line)
			t.Log(line)
			println(line) // one line per nemesis, also without -v
			for _, e := range res.errors {
				t.Logf("client errors: %s", e)
			}
			res.judge(t, nm)
		})
	}
	t.Logf("summary:\n%s", strings.Join(lines, "\n"))
}

// phaseResult is what one nemesis did to the workload.
type phaseResult struct {
	failover                time.Duration // fault until a new primary accepted a connection
	clientsOK, clientsBound time.Duration // fault until the last client's first success afterwards
	slowest                 string        // that client, or the ones that never succeeded
	told, toldBound         time.Duration // old primary down until the last advisory holder was told
	toldN                   int           // advisory locks lost to the fault
	tokenBefore, tokenAfter int64
	overlaps                []check.Overlap
	linearizable            porcupine.CheckResult
	fenced                  check.FencedResult
	ledger                  check.LedgerReport
	itemsLost, itemsDoubled []string
	backwards               []string
	lagBytes                int64
	holderOverlaps          []holderOverlap
	grace                   time.Duration // the failover grace the fault imposed
	graceKnown              bool          // the database shows its grace
	errors                  []string
	newPrimary, oldPrimary  string
}

func (r phaseResult) line(nm nemesis) string {
	grace := "-"
	if r.graceKnown {
		grace = fmt.Sprint(r.grace.Milliseconds())
	}
	var overlapped time.Duration
	for _, o := range r.holderOverlaps {
		overlapped = max(overlapped, o.d)
	}
	return fmt.Sprintf("ha: %-18s failover_ms %d grace_ms %s clients_ok_ms %d (bound %d) told_ms %d (bound %d) token %s -> %s "+
		"overlaps %d holder_overlaps %d (longest %d ms) stale_accepted %d lost %d doubled %d items_lost %d items_doubled %d backwards %d acked_lost %d",
		nm.name, r.failover.Milliseconds(), grace, r.clientsOK.Milliseconds(), r.clientsBound.Milliseconds(),
		r.told.Milliseconds(), r.toldBound.Milliseconds(), fmtToken(r.tokenBefore), fmtToken(r.tokenAfter),
		len(r.overlaps), len(r.holderOverlaps), overlapped.Milliseconds(), len(r.ledger.StaleAccepted), r.lostViolations(nm), len(r.ledger.Doubled),
		len(r.itemsLost), len(r.itemsDoubled), len(r.backwards), len(r.ledger.Lost))
}

// lostViolations counts acknowledged writes lost where the setup promises
// none: everywhere but after the death of a leader whose replication was
// asynchronous.
func (r phaseResult) lostViolations(nm nemesis) int {
	if nm.lossy {
		return 0
	}
	return len(r.ledger.Lost)
}

// fmtToken shows a token's epoch and sequence parts (pgbaton.next_token).
func fmtToken(tok int64) string {
	return fmt.Sprintf("%d(e%d+%d)", tok, tok>>40, tok&(1<<40-1))
}

func (r phaseResult) judge(t *testing.T, nm nemesis) {
	assert.Empty(t, r.overlaps, "critical sections overlap")
	assert.Empty(t, r.holderOverlaps, "a holder was granted the lease before the previous one was told it lost it")
	assert.Equal(t, porcupine.Ok, r.linearizable, "history not linearizable as a mutex per key")
	assert.Equal(t, porcupine.Ok, r.fenced.Result, "history not linearizable as a fenced lease per key: %s", r.fenced.Explanation)
	assert.Empty(t, r.ledger.StaleAccepted, "stale tokens accepted by fenced writes")
	assert.Empty(t, r.ledger.Doubled, "ledger writes doubled")
	assert.Empty(t, r.itemsLost, "work items lost")
	assert.Empty(t, r.itemsDoubled, "work items done twice")
	assert.Empty(t, r.backwards, "tokens went backwards")
	assert.Greater(t, r.tokenAfter, r.tokenBefore, "first token after the fault not above every token before it")
	assert.LessOrEqual(t, r.clientsOK, r.clientsBound, "clients did not all work again in time: %s", r.slowest)
	assert.Positive(t, r.toldN, "no advisory lock was lost to the fault: the nemesis missed")
	assert.LessOrEqual(t, r.told, r.toldBound, "advisory holders told late")
	switch {
	case nm.lag:
		// The nemesis must have lost acknowledged commits, or it proved
		// nothing about tokens surviving such a loss.
		assert.Positive(t, r.lagBytes, "replication did not lag")
		assert.NotEmpty(t, r.ledger.Lost, "the failover to the lagging standby lost no acknowledged write")
	case !nm.lossy:
		assert.Empty(t, r.ledger.Lost, "acknowledged writes lost")
	}
}

// runPhase runs the workload through one nemesis and checks it.
func runPhase(t *testing.T, ctx context.Context, c *hacluster.Cluster, pool *pgxpool.Pool, phase int, nm nemesis) phaseResult {
	var r phaseResult
	maxLag := 1 << 20 // Patroni's default
	if nm.lag {
		// Let the lagging replica be promoted: this phase is about what
		// asynchronous replication may lose.
		maxLag = 1 << 30
	}
	require.NoError(t, c.SetConfig(ctx, map[string]any{"synchronous_mode": nm.sync, "maximum_lag_on_failover": maxLag}))
	leader, err := waitHealthy(ctx, c, nm.sync)
	require.NoError(t, err)
	other := ""
	for _, n := range c.Nodes() {
		if n.Name != leader {
			other = n.Name
			break
		}
	}
	r.oldPrimary = leader

	w := &workload{url: c.URL("pgbaton"), pinnedURL: c.NodeURL(leader, "pgbaton"), phase: phase, hist: check.NewHistory(),
		ledger: pgx.Identifier{fmt.Sprintf("ha_ledger_%d", phase)}, head: pgx.Identifier{fmt.Sprintf("ha_head_%d", phase)},
		group: fmt.Sprintf("ha:p%d:items", phase)}
	prepare(t, ctx, pool, w)
	// Everything prepared is on the replica before the fault.
	_, err = waitHealthy(ctx, c, nm.sync)
	require.NoError(t, err)
	old, err := whoIsPrimary(ctx, c.URL("postgres"))
	require.NoError(t, err)
	require.Equal(t, c.Node(leader).Port, old.Port, "the URL does not reach Patroni's leader")

	wctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	require.NoError(t, w.start(wctx))
	warmUp(t, ctx, w)

	if nm.lag {
		// Item registrations stay out of the lost window: an item whose
		// registration is lost never existed for the new primary.
		w.stopFeeding()
		_, err = waitHealthy(ctx, c, false)
		require.NoError(t, err)
		c.StallReplication(leader)
		time.Sleep(lagFor) // the lag is the point: commits the replica never gets
		r.lagBytes = replicationLag(t, ctx, c, leader)
	}
	graceBefore := readGrace(ctx, pool)
	watch, err := watchFailover(ctx, c, old)
	require.NoError(t, err)
	t0, wall0 := check.MonoNow(), time.Now()
	killed, err := nm.inject(ctx, c, leader, other)
	// Whatever happens next, the cluster is whole again for the next
	// phase.
	defer func() {
		if killed {
			assert.NoError(t, c.StartNode(ctx, leader))
		}
		if nm.lag {
			c.ResumeReplication(leader)
		}
	}()
	if nm.lag {
		// Whatever the stall held back is gone with the old leader.
		c.CutReplication(leader)
	}
	require.NoError(t, err)
	var f failover
	select {
	case f = <-watch:
	case <-time.After(2 * time.Minute):
		t.Fatal("no failover within 2 minutes")
	}
	require.NoError(t, f.Err)
	for _, n := range c.Nodes() {
		if n.Port == f.New.Port {
			r.newPrimary = n.Name
		}
	}
	r.failover = time.Duration(f.Up - t0)
	r.clientsBound = r.failover + 2*time.Second
	r.toldBound = pingInterval + pingTimeout

	// Every client works again (or the bound passes and the check fails),
	// after the failover grace: at most the longest TTL in use.
	deadline := time.Now().Add(time.Duration(f.Up-check.MonoNow()) + r.clientsBound + holderTTL + 10*time.Second)
	// And every holder of a lease granted before the fault has been told
	// it is lost, or renewed it on the new primary: their deadlines are at
	// most holderTTL after the fault.
	for time.Now().Before(deadline) && (!allWorked(w, f.Up) || check.MonoNow() < t0+int64(holderTTL)) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // some work on the new primary
	w.stop()
	drain(t, ctx, pool, w)
	w.stopClaims()
	stopAll()

	graceAfter := readGrace(ctx, pool)
	r.grace, r.graceKnown = graceAfter.imposed(graceBefore), graceAfter.known
	// No grant is made before the grace ends (it begins once the new
	// primary is up and a client stores the new timeline): the bound
	// counts from its end. The database's clock is this machine's.
	if r.grace > 0 {
		r.clientsBound = max(r.clientsBound, graceAfter.until.Sub(wall0)+2*time.Second)
	}
	measure(&r, w, f, t0)
	r.holderOverlaps = holderOverlaps(w.snapshotSpans())
	events := w.hist.Snapshot()
	gs, unknown := check.Grants(events)
	r.overlaps = check.Overlaps(gs)
	r.linearizable = check.Linearizable(gs, unknown, time.Minute)
	var ledgerEvents []check.Event // the lease workers'
	for _, ev := range events {
		if ev.Proc < 100 {
			ledgerEvents = append(ledgerEvents, ev)
		}
	}
	r.ledger, err = check.CheckLedger(ctx, pool, w.ledger, ledgerEvents)
	require.NoError(t, err)
	ordered, err := check.LedgerOrder(ctx, pool, w.ledger, events)
	require.NoError(t, err)
	if nm.lossy {
		// The new primary may not know a grant its holder still trusts:
		// its fence turning the holder away proves nothing here.
		ordered = slices.DeleteFunc(ordered, check.Rejected)
	}
	r.fenced = check.FencedLinearizable(ordered, time.Minute)
	var tokens []check.Grant
	for _, g := range gs {
		if g.Token > 0 {
			tokens = append(tokens, g)
		}
	}
	r.backwards = check.TokensBackwards(tokens)
	r.tokenBefore, r.tokenAfter = tokensAround(tokens, t0, f.Up)
	r.itemsLost, r.itemsDoubled = checkItems(t, ctx, pool, w)
	r.errors = w.errorSummary(8)
	t.Logf("leader %s -> %s; replication lag at the fault %d bytes; history %d events; fenced lease model %s (%d ops)",
		r.oldPrimary, r.newPrimary, r.lagBytes, len(events), r.fenced.Result, r.fenced.Ops)
	for _, o := range r.overlaps[:min(3, len(r.overlaps))] {
		t.Logf("overlap: %s", o)
	}
	for _, o := range r.holderOverlaps {
		t.Logf("holder overlap: %s", o)
	}
	for _, s := range w.snapshotSpans() {
		t.Logf("holder span: %s token %s %+dms..%+dms (from the fault) lost=%t ongoing=%t", s.client, fmtToken(s.token), (s.start-t0)/1e6, (s.end-t0)/1e6, s.lost, s.ongoing)
	}
	t.Logf("clients working again, after the new primary: %s", sinceUp(w, f))
	logClient(t, w, events, r.slowest, t0, t0+int64(r.clientsOK))
	if traceLib {
		for i := range leaseWorkers {
			if name := w.key("lease-%d", i); !strings.Contains(r.slowest, name) {
				logClient(t, w, events, fmt.Sprintf("p%d-lease-%d", phase, i), t0, t0+int64(r.clientsOK))
			}
		}
	}
	for _, s := range r.backwards[:min(3, len(r.backwards))] {
		t.Logf("backwards: %s", s)
	}
	return r
}

// waitHealthy is c.WaitHealthy, bounded: a replica that never streams
// fails the phase instead of hanging the run.
func waitHealthy(ctx context.Context, c *hacluster.Cluster, sync bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return c.WaitHealthy(ctx, sync)
}

// prepare creates the phase's ledger.
func prepare(t *testing.T, ctx context.Context, pool *pgxpool.Pool, w *workload) {
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
		CREATE TABLE %s (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL, op_id text NOT NULL, seq bigint NOT NULL)`,
		w.head.Sanitize(), w.ledger.Sanitize()))
	require.NoError(t, err)
	for k := range leaseKeys {
		_, err := pool.Exec(ctx, "INSERT INTO "+w.head.Sanitize()+" (key) VALUES ($1)", w.key("lease:%d", k))
		require.NoError(t, err)
	}
}

// warmUp waits until every client has succeeded once, and a second more.
func warmUp(t *testing.T, ctx context.Context, w *workload) {
	start := check.MonoNow()
	pgtest.Eventually(t, time.Minute, func() (bool, error) { return allWorked(w, 0), ctx.Err() },
		"a client never succeeded before the fault: %v", w.errorSummary(5))
	time.Sleep(time.Second - time.Duration(check.MonoNow()-start)%time.Second)
}

// allWorked reports whether every client succeeded after t.
func allWorked(w *workload, t int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.clients {
		if c.counts() && c.firstOKAfter(t) == 0 {
			return false
		}
	}
	return true
}

// replicationLag is how far (bytes of WAL) the replicas' replay is behind
// the leader.
func replicationLag(t *testing.T, ctx context.Context, c *hacluster.Cluster, leader string) int64 {
	conn, err := connectPrimary(ctx, c.NodeURL(leader, "postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var lag int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(max(pg_current_wal_lsn() - coalesce(replay_lsn, '0/0')), 0)::bigint
		FROM pg_stat_replication`).Scan(&lag))
	return lag
}

// drain waits until every work item of the phase is completed: claimers
// take over the items of leases lost to the fault once they expire.
func drain(t *testing.T, ctx context.Context, pool *pgxpool.Pool, w *workload) {
	var left int
	pgtest.Eventually(t, 2*time.Minute, func() (bool, error) {
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = $1", w.group).Scan(&left)
		return left == 0, err
	}, "work items not drained: %d left; claimer errors: %v", &left, w.errorSummary(5))
}

// checkItems: every work item whose registration was acknowledged is
// done exactly once.
func checkItems(t *testing.T, ctx context.Context, pool *pgxpool.Pool, w *workload) (lost, doubled []string) {
	w.mu.Lock()
	names := append([]string(nil), w.registered...)
	w.mu.Unlock()
	require.NotEmpty(t, names)
	rows, err := pool.Query(ctx, `SELECT i.name, count(d.item)
		FROM unnest($1::text[]) i(name) LEFT JOIN ha_item_done d ON d.item = i.name GROUP BY i.name`, names)
	require.NoError(t, err)
	type row struct {
		Name string
		N    int
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, got, len(names))
	for _, r := range got {
		switch {
		case r.N == 0:
			lost = append(lost, r.Name)
		case r.N > 1:
			doubled = append(doubled, fmt.Sprintf("%s done %d times", r.Name, r.N))
		}
	}
	return lost, doubled
}

// measure fills in the liveness figures: when each client worked again,
// when holders were told.
func measure(r *phaseResult, w *workload, f failover, t0 int64) {
	var never []string
	w.mu.Lock()
	for _, c := range w.clients {
		if !c.counts() {
			continue
		}
		// After the new primary was seen up: a success before may still
		// have been on the old one. (One on the new primary in the few
		// milliseconds before the monitor saw it is missed: the figure
		// errs long.)
		first := c.firstOKAfter(f.Up)
		if first == 0 {
			never = append(never, c.name)
			continue
		}
		if d := time.Duration(first - t0); d > r.clientsOK {
			r.clientsOK, r.slowest = d, c.name
		}
	}
	w.mu.Unlock()
	if len(never) > 0 {
		r.clientsOK, r.slowest = time.Hour, "never worked again: "+strings.Join(never, ", ")
	}
	for _, n := range w.snapshotNotices() {
		// Lost to the fault: granted before the old primary went down,
		// told after the fault began.
		if n.Granted >= f.Down || n.Told < t0 {
			continue
		}
		if n.Kind == "advisory" {
			r.toldN++
			r.told = max(r.told, time.Duration(max(n.Told-f.Down, 0)))
		}
	}
}

// tokensAround returns the largest token granted before the fault and
// the first one granted after the new primary came up.
func tokensAround(gs []check.Grant, t0, up int64) (before, after int64) {
	first := int64(0)
	for _, g := range gs {
		if g.Start < t0 {
			before = max(before, g.Token)
		}
		if g.Start > up && (first == 0 || g.Start < first) {
			first, after = g.Start, g.Token
		}
	}
	return before, after
}

// logClient logs what the named client did between from and to (MonoNow),
// to show why it was slow to work again.
func logClient(t *testing.T, w *workload, events []check.Event, name string, from, to int64) {
	procs := map[int]bool{}
	w.mu.Lock()
	for _, c := range w.clients {
		if strings.Contains(name, c.name) && c.group == nil {
			for _, p := range c.procs {
				procs[p] = true
			}
		}
	}
	for _, c := range w.clients {
		if strings.Contains(name, c.name) {
			c.mu.Lock()
			for _, tr := range c.trace {
				if tr.at >= from && tr.at <= to {
					t.Logf("slowest: %s %+dms lib: %s", name, (tr.at-to)/1e6, tr.msg)
				}
			}
			c.mu.Unlock()
		}
	}
	w.mu.Unlock()
	for _, ev := range events {
		if procs[ev.Proc] && ev.Mono >= from && ev.Mono <= to {
			t.Logf("slowest: %s %+dms p%d %s %s %s tok %d %s", name, (ev.Mono-to)/1e6, ev.Proc, ev.Op, ev.Type, ev.Key, ev.Token, ev.Err)
		}
	}
}

// sinceUp lists how long after the new primary came up each client first
// worked again.
func sinceUp(w *workload, f failover) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, c := range w.clients {
		if !c.counts() {
			continue
		}
		if first := c.firstOKAfter(f.Up); first > 0 {
			out = append(out, fmt.Sprintf("%s %+dms", c.name, (first-f.Up)/1e6))
		} else {
			out = append(out, c.name+" never")
		}
	}
	return strings.Join(out, ", ")
}
