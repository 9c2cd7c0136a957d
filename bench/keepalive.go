package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/leasetable"
)

// keepTTL is the lease TTL of the keep-alive scenarios; the renew interval
// is the library's default, TTL/3.
const keepTTL = 3 * time.Second

// keepClaimers claim the leases concurrently, keepClaimBatch at a time.
const (
	keepClaimers   = 4
	keepClaimBatch = 5000
	keepChunk      = 10000 // names per Register, leases per Complete
	rawRenewers    = 8     // connections of the naive per-lease renewal
)

// keepRuns numbers the runs, so that every run claims fresh names.
var keepRuns atomic.Int64

func keepAliveTitle(n int) string {
	return fmt.Sprintf("Keep-alive: %s leases held by one client", thousands(n))
}

// keepAliveScenario: one Client takes n leases and holds them for
// e.keepHold; what does keeping them alive cost the server?
func (e *env) keepAliveScenario(n int) *scenario {
	interval := keepTTL / 3
	sc := &scenario{
		title: keepAliveTitle(n),
		note: fmt.Sprintf("One leasetable.Client (TTL %s, RenewInterval %s: the defaults for that TTL) registers %s work items "+
			"(Register, %s names per call) and claims them all (Claim, %d concurrent claimers of %d leases per call), then holds "+
			"them. Setup: registering and claiming, until all %s are held. Then, not measured, VACUUM (ANALYZE) of the lease table "+
			"(or autovacuum would clean up after the setup during the hold) and %s of holding, so that the setup's statistics are "+
			"flushed; then the measured hold of %s. commits/s = "+
			"pg_stat_database.xact_commit of the database ÷ seconds, without the sampler's own (this counts read-only "+
			"transactions too, such as pgxpool's ping of a connection idle for over 1 s before it hands it out); write "+
			"txns/s = transaction ids assigned (cluster-wide); server CPU = utime+stime of the cluster's processes (/proc; the postmaster, its live "+
			"children and those reaped, at %d ticks/s) ÷ wall time, in %% of one core; client CPU: this process. Lost: leases whose "+
			"Err is ErrLeaseLost after the hold (must be 0); held at end: rows of pgbaton.lease_status held by the owner then. "+
			"Raw pgx is the naive alternative: every lease renewed on its own (pgbaton.renew, one statement and one commit per "+
			"lease per %s) over %d connections; it is measured up to %s leases, and above that computed (N ÷ %s).",
			keepTTL, interval, thousands(n), thousands(keepChunk), keepClaimers, keepClaimBatch, thousands(n),
			min(keepSettle, e.keepHold), e.keepHold,
			clockTicks, interval, rawRenewers, thousands(e.keepRaw), interval),
		metrics: []metric{
			{name: "commits/s", format: "%.1f"},
			{name: "write txns/s", format: "%.1f"},
			{name: "server CPU %", format: "%.1f"},
			{name: "client CPU %", format: "%.1f"},
			{name: "lost"},
			{name: "held at end"},
			{name: "setup s", format: "%.2f"},
		},
		runs:     1, // a long hold; one run is its own average
		noWarmup: true,
	}
	sc.impls = append(sc.impls, &impl{
		name: "pgbaton leasetable.Client (one keep-alive per client)",
		run:  func(ctx context.Context) (sample, error) { return e.keepPgbaton(ctx, n) },
	})
	raw := &impl{
		name: fmt.Sprintf("raw pgx (pgbaton.renew per lease per %s)", interval),
		run:  func(ctx context.Context) (sample, error) { return e.keepRawRun(ctx, n, interval) },
	}
	if n > e.keepRaw {
		raw.skip = fmt.Sprintf("not run above %s leases (-keepraw); computed: %s renewals per %s = %s commits/s",
			thousands(e.keepRaw), thousands(n), interval, thousands(int(float64(n)/interval.Seconds())))
	}
	sc.impls = append(sc.impls, raw)
	return sc
}

// keepSettle is how long the leases are held before the measured hold
// starts: a backend flushes its statistics up to 10 s after its last
// transaction (PGSTAT_IDLE_INTERVAL), so the setup's commits would
// otherwise be counted as the hold's.
const keepSettle = 11 * time.Second

// hold vacuums the lease table (autovacuum would otherwise clean up the
// setup's rows during the hold), lets the statistics settle, then sleeps
// for the hold and samples the server before and after it.
func (e *env) hold(ctx context.Context, mon *monitor) (usage, error) {
	if err := mon.exec(ctx, "VACUUM (ANALYZE) pgbaton.lease"); err != nil {
		return usage{}, err
	}
	select {
	case <-time.After(min(keepSettle, e.keepHold)):
	case <-ctx.Done():
		return usage{}, ctx.Err()
	}
	a, err := mon.sample(ctx)
	if err != nil {
		return usage{}, err
	}
	select {
	case <-time.After(e.keepHold): // the thing measured: what holding costs over time
	case <-ctx.Done():
		return usage{}, ctx.Err()
	}
	b, err := mon.sample(ctx)
	if err != nil {
		return usage{}, err
	}
	return between(a, b), nil
}

func (u usage) sample(lost, held int, setup time.Duration) sample {
	return sample{"commits/s": u.commitsPerSec, "write txns/s": u.writesPerSec, "server CPU %": u.serverCPU,
		"client CPU %": u.clientCPU, "lost": float64(lost), "held at end": float64(held), "setup s": setup.Seconds()}
}

func (e *env) heldBy(ctx context.Context, mon *monitor, owner string) (int, error) {
	var held int
	err := mon.queryRow(ctx, "SELECT count(*) FROM pgbaton.lease_status WHERE owner = $1 AND held", []any{owner}, &held)
	return held, err
}

func keepNames(group string, from, to int) []string {
	names := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		names = append(names, fmt.Sprintf("%s/%07d", group, i))
	}
	return names
}

func (e *env) keepPgbaton(ctx context.Context, n int) (sample, error) {
	mon, err := e.newMonitor(ctx, "bench-monitor")
	if err != nil {
		return nil, err
	}
	defer mon.close(ctx)
	pool, err := e.pool(ctx, "bench-keepalive", 8)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	run := keepRuns.Add(1)
	owner := fmt.Sprintf("bench-keepalive-%d", run)
	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: owner, TTL: keepTTL})
	if err != nil {
		return nil, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	group := fmt.Sprintf("bench-keep-%d", run)

	start := time.Now()
	if err := inChunks(n, keepChunk, func(from, to int) error {
		_, err := c.Register(ctx, group, keepNames(group, from, to)...)
		return err
	}); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	leases := make([]*leasetable.Lease, 0, n)
	err = parallel(keepClaimers, func(int) error {
		for {
			ls, err := c.Claim(ctx, group, keepClaimBatch)
			if err != nil || len(ls) == 0 {
				return err
			}
			mu.Lock()
			leases = append(leases, ls...)
			mu.Unlock()
		}
	})
	setup := time.Since(start)
	if err != nil {
		return nil, err
	}
	if len(leases) != n {
		return nil, fmt.Errorf("claimed %d of %d leases", len(leases), n)
	}

	u, err := e.hold(ctx, mon)
	if err != nil {
		return nil, err
	}
	lost := 0
	var other error
	for _, l := range leases {
		switch err := l.Err(); {
		case err == nil:
		case errors.Is(err, leasetable.ErrLeaseLost):
			lost++
		default:
			other = err
		}
	}
	held, err := e.heldBy(ctx, mon, owner)
	if err != nil {
		return nil, err
	}
	if other != nil {
		return nil, fmt.Errorf("a lease ended without being lost: %w", other)
	}
	// Not timed: complete them all, which deletes their rows.
	for i := 0; i < len(leases); i += keepChunk {
		if err := c.Complete(ctx, leases[i:min(i+keepChunk, len(leases))]...); err != nil && !errors.Is(err, leasetable.ErrNotHeld) {
			return nil, err
		}
	}
	return u.sample(lost, held, setup), nil
}

// keepRawRun is the naive alternative: the same leases, each renewed on
// its own once per interval, over rawRenewers connections.
func (e *env) keepRawRun(ctx context.Context, n int, interval time.Duration) (sample, error) {
	mon, err := e.newMonitor(ctx, "bench-monitor")
	if err != nil {
		return nil, err
	}
	defer mon.close(ctx)
	pool, err := e.pool(ctx, "bench-keepalive-raw", rawRenewers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	run := keepRuns.Add(1)
	owner := fmt.Sprintf("bench-keepalive-raw-%d", run)
	group := fmt.Sprintf("bench-keep-raw-%d", run)
	ttlMs := keepTTL.Milliseconds()
	margin := keepTTL / 10

	type rawLease struct {
		name    string
		token   int64
		renewed time.Time // send time of the last successful grant or renewal
		lost    bool
	}
	start := time.Now()
	if err := inChunks(n, keepChunk, func(from, to int) error {
		_, err := pool.Exec(ctx, "SELECT pgbaton.register($1, $2)", group, keepNames(group, from, to))
		return err
	}); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	leases := make([]*rawLease, 0, n)
	err = parallel(keepClaimers, func(int) error {
		for {
			sent := time.Now()
			rows, _ := pool.Query(ctx, "SELECT name, token FROM pgbaton.claim($1, $2, $3, $4)", group, owner, keepClaimBatch, ttlMs)
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*rawLease, error) {
				l := &rawLease{renewed: sent}
				return l, r.Scan(&l.name, &l.token)
			})
			if err != nil || len(got) == 0 {
				return err
			}
			mu.Lock()
			leases = append(leases, got...)
			mu.Unlock()
		}
	})
	setup := time.Since(start)
	if err != nil {
		return nil, err
	}
	if len(leases) != n {
		return nil, fmt.Errorf("claimed %d of %d leases", len(leases), n)
	}

	holdCtx, stop := context.WithCancel(ctx)
	renewErr := make(chan error, 1)
	go func() {
		renewErr <- parallel(rawRenewers, func(w int) error {
			return pool.AcquireFunc(holdCtx, func(c *pgxpool.Conn) error {
				for round := time.Now(); ; round = round.Add(interval) {
					select {
					case <-time.After(time.Until(round)):
					case <-holdCtx.Done():
						return nil
					}
					for i := w; i < len(leases); i += rawRenewers {
						l := leases[i]
						if l.lost {
							continue
						}
						sent := time.Now()
						var exp time.Time
						err := c.QueryRow(holdCtx, "SELECT expires_at FROM pgbaton.renew($1, $2, $3, $4)", l.name, owner, l.token, ttlMs).Scan(&exp)
						switch {
						case holdCtx.Err() != nil:
							return nil
						case errors.Is(err, pgx.ErrNoRows):
							l.lost = true // expired before its renewal arrived
						case err != nil:
							return err
						case time.Now().After(l.renewed.Add(keepTTL - margin)):
							l.lost = true // renewed, but after its holder's local deadline
						default:
							l.renewed = sent
						}
					}
				}
			})
		})
	}()
	u, err := e.hold(ctx, mon)
	stop()
	if rerr := <-renewErr; err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	lost := 0
	names, tokens := make([]string, 0, n), make([]int64, 0, n)
	for _, l := range leases {
		if l.lost {
			lost++
		}
		names, tokens = append(names, l.name), append(tokens, l.token)
	}
	held, err := e.heldBy(ctx, mon, owner)
	if err != nil {
		return nil, err
	}
	// Not timed: complete them all, which deletes their rows.
	if err := inChunks(n, keepChunk, func(from, to int) error {
		_, err := pool.Exec(ctx, "SELECT count(*) FROM pgbaton.complete_many($1, $2, $3)", names[from:to], tokens[from:to], owner)
		return err
	}); err != nil {
		return nil, err
	}
	return u.sample(lost, held, setup), nil
}

// thousands formats n with commas: 100000 -> "100,000".
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
