package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/leasetable"
)

const (
	fleetMaxConns    = 2               // pool_max_conns of every client, as the README advises for fleets
	fleetItems       = 5               // work items registered, claimed and completed per iteration
	fleetWaitLimit   = 5 * time.Second // an Acquire that waits longer counts as an error
	fleetSampleEvery = 250 * time.Millisecond
	fleetOpeners     = 16 // clients created concurrently (not timed)
	fleetPerName     = 10 // clients per shared lease name: some acquires wait
)

// fleetNames is how many lease names a fleet of clients shares.
func fleetNames(clients int) int { return max(clients/fleetPerName, 2) }

// fleetRuns numbers the runs: names, owners and application names are
// fresh in every run.
var fleetRuns atomic.Int64

func fleetTitle(clients int) string {
	return fmt.Sprintf("Fleet: %s clients", thousands(clients))
}

// fleetScenario: clients separate leasetable Clients, each with its own
// small pool, as many pods would run them, churn leases and work items
// for e.fleetWindow.
func (e *env) fleetScenario(clients int) *scenario {
	sc := &scenario{
		title: fleetTitle(clients),
		note: fmt.Sprintf("%s leasetable.Clients in one process, each with its own pgxpool (MaxConns %d) and owner, as %s "+
			"pods would run them. Each starts at a random instant within %s and loops: Acquire one of %s shared lease names "+
			"at random (it waits when another client holds it, so p99 shows waits; a wait over %s counts as an error), Renew, "+
			"Release; Register %d new work items in a shared group, Claim %d, Complete them; then pauses a random 0–%s "+
			"(mean %s). Before each run, not timed: VACUUM (ANALYZE) of the lease tables and a CHECKPOINT, so that no run is timed while the server cleans up after what ran before. After a warm-up of %s (every client has started and made its first session keep-alive), a window of %s is measured. ops/s: the library calls that succeeded ÷ the "+
			"window. Acquire latency: call to return, waits included. Connections: the most server connections of the fleet "+
			"seen at once (pg_stat_activity sampled every %s, pool and LISTEN connections by client) ÷ clients, and the most "+
			"any one client had. Conns opened: the connections the clients' pools opened during the window ÷ clients "+
			"(pgxpool's NewConnsCount; a pool opens one when a call finds its connections busy, so this counts the "+
			"client's own calls that overlapped; the LISTEN connection is not counted). Commits/call and writes/call: the database's committed transactions "+
			"(pg_stat_database) and the transaction ids assigned (write transactions) in the window ÷ the calls that "+
			"succeeded: what the server did per call, failed attempts, waits and keep-alives included. Server CPU: the cluster's processes, in %% of one core; client CPU: this process, all "+
			"clients; machine CPU: every process and the kernel (/proc/stat, all CPUs), so that a run slowed by something "+
			"else shows; steal: time the hypervisor kept this guest's CPUs from running. NoListen: the documented fleet setting, no LISTEN connection; a waiter looks again at the holder's "+
			"known expiry, at most every PollInterval. Default: a LISTEN connection per client while it holds one of the "+
			"database's 16 listen slots, opened with its pool's settings at a wait when a slot is free (up to MaxConns + 1 "+
			"connections), listening only while the client waits, closed 30s after its last wait (the waiters of the "+
			"others poll, from 50ms up to PollInterval); skipped when %s "+
			"clients × %d connections would not fit the server's max_connections. raw pgx: the same loop calling the same "+
			"SQL functions (try_acquire, renew, release, register, claim, complete_many) on each client's pool, a waiter "+
			"trying again every PollInterval, no lease session: what pgbaton's client adds is the difference.",
			thousands(clients), fleetMaxConns, thousands(clients), 2*e.fleetPause, thousands(fleetNames(clients)),
			fleetWaitLimit, fleetItems, fleetItems, 2*e.fleetPause, e.fleetPause, e.fleetWarmup(), e.fleetWindow,
			fleetSampleEvery, thousands(clients), fleetMaxConns+1),
		metrics: []metric{
			{name: "ops/s", higherBetter: true},
			{name: "acquire p50 ms", format: "%.2f"},
			{name: "acquire p99 ms", format: "%.1f"},
			{name: "conns/client", format: "%.2f"},
			{name: "max conns/client"},
			{name: "conns opened/client", format: "%.2f"},
			{name: "commits/call", format: "%.2f"},
			{name: "writes/call", format: "%.2f"},
			{name: "server CPU %"},
			{name: "client CPU %"},
			{name: "machine CPU %"},
			{name: "steal %"},
			{name: "errors"},
		},
		runs:     3,
		noWarmup: true, // every run opens its own fleet
		noRatios: true,
	}
	if e.fleetOpen > 0 {
		sc.note += fmt.Sprintf(" -fleetopen %d: each client's pool opened %d connections before its loop began (not timed).", e.fleetOpen, e.fleetOpen)
	}
	sc.impls = append(sc.impls, &impl{
		name: fmt.Sprintf("pgbaton, NoListen, PollInterval %s", e.fleetPoll),
		run: func(ctx context.Context) (sample, error) {
			return e.fleetRun(ctx, clients, leasetable.Config{NoListen: true, PollInterval: e.fleetPoll})
		},
	})
	listen := &impl{
		name: "pgbaton, default config (LISTEN)",
		run: func(ctx context.Context) (sample, error) {
			return e.fleetRun(ctx, clients, leasetable.Config{})
		},
	}
	if need := clients*(fleetMaxConns+1) + 20; e.maxConnections > 0 && need > e.maxConnections {
		listen.skip = fmt.Sprintf("needs up to %s connections, max_connections is %s", thousands(need), thousands(e.maxConnections))
	}
	sc.impls = append(sc.impls, listen, &impl{
		name: fmt.Sprintf("raw pgx, same SQL, retry every %s", e.fleetPoll),
		run: func(ctx context.Context) (sample, error) {
			return e.fleetRunWith(ctx, clients, func(pool *pgxpool.Pool, owner string) (fleetAPI, error) {
				return &rawFleet{pool: pool, owner: owner, poll: e.fleetPoll}, nil
			})
		},
	})
	return sc
}

// settle vacuums the lease client's tables and writes a checkpoint (not
// timed), so that every fleet run, whichever implementation and whatever
// ran before (the keep-alive scenarios hold up to 100k leases, and each
// fleet run deletes its rows), starts on the same server: otherwise a
// run could be timed while autovacuum cleans up after the one before or
// a checkpoint flushes its writes. CHECKPOINT is skipped, with a note on
// stderr, for a role that may not run it.
func settle(ctx context.Context, mon *monitor) error {
	if err := mon.exec(ctx, "VACUUM (ANALYZE) pgbaton.lease, pgbaton.lease_session, pgbaton.lease_waiter"); err != nil {
		return err
	}
	if err := mon.exec(ctx, "CHECKPOINT"); err != nil {
		if pgerr.Code(err) != pgerrcode.InsufficientPrivilege {
			return err
		}
		settleOnce.Do(func() { fmt.Fprintln(os.Stderr, "bench: fleet runs start without a CHECKPOINT:", err) })
	}
	return nil
}

var settleOnce sync.Once

// fleetAPI is what a fleet member does: through a leasetable.Client, or
// the same SQL functions called with raw pgx.
type fleetAPI interface {
	acquire(ctx context.Context, name string) (release func(context.Context) error, renew func(context.Context) error, err error)
	register(ctx context.Context, group string, items []string) error
	claimComplete(ctx context.Context, group string, n int, done func(error) bool)
	close(ctx context.Context)
}

// clientFleet is a fleet member using a leasetable.Client.
type clientFleet struct{ c *leasetable.Client }

func (f clientFleet) acquire(ctx context.Context, name string) (func(context.Context) error, func(context.Context) error, error) {
	l, err := f.c.Acquire(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return l.Release, l.Renew, nil
}

func (f clientFleet) register(ctx context.Context, group string, items []string) error {
	_, err := f.c.Register(ctx, group, items...)
	return err
}

func (f clientFleet) claimComplete(ctx context.Context, group string, n int, done func(error) bool) {
	ls, err := f.c.Claim(ctx, group, n)
	if done(err) && len(ls) > 0 {
		done(f.c.Complete(ctx, ls...))
	}
}

func (f clientFleet) close(ctx context.Context) { _ = f.c.Close(ctx) }

// rawFleet is a fleet member calling pgbaton's SQL functions directly: no
// lease session (each grant carries its own TTL), no LISTEN, a waiter tries
// again every poll.
type rawFleet struct {
	pool  *pgxpool.Pool
	owner string
	poll  time.Duration
}

const rawFleetTTLms = 10000

func (f *rawFleet) acquire(ctx context.Context, name string) (func(context.Context) error, func(context.Context) error, error) {
	for {
		var token int64
		err := f.pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire($1, $2, $3)", name, f.owner, rawFleetTTLms).Scan(&token)
		switch {
		case err == nil:
			release := func(ctx context.Context) error {
				_, err := f.pool.Exec(ctx, "SELECT released FROM pgbaton.release($1, $2, $3)", name, f.owner, token)
				return err
			}
			renew := func(ctx context.Context) error {
				_, err := f.pool.Exec(ctx, "SELECT * FROM pgbaton.renew($1, $2, $3, $4)", name, f.owner, token, rawFleetTTLms)
				return err
			}
			return release, renew, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, nil, err
		}
		select {
		case <-time.After(f.poll):
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

func (f *rawFleet) register(ctx context.Context, group string, items []string) error {
	_, err := f.pool.Exec(ctx, "SELECT pgbaton.register($1, $2)", group, items)
	return err
}

func (f *rawFleet) claimComplete(ctx context.Context, group string, n int, done func(error) bool) {
	rows, err := f.pool.Query(ctx, "SELECT name, token FROM pgbaton.claim($1, $2, $3, $4)", group, f.owner, n, rawFleetTTLms)
	var names []string
	var tokens []int64
	if err == nil {
		var name string
		var token int64
		_, err = pgx.ForEachRow(rows, []any{&name, &token}, func() error {
			names, tokens = append(names, name), append(tokens, token)
			return nil
		})
	}
	if done(err) && len(names) > 0 {
		_, err := f.pool.Exec(ctx, "SELECT pgbaton.complete_many($1, $2, $3)", names, tokens, f.owner)
		done(err)
	}
}

func (f *rawFleet) close(context.Context) {}

// fleetClient is one member of the fleet.
type fleetClient struct {
	pool *pgxpool.Pool
	api  fleetAPI
	lat  []time.Duration // acquire latencies
	ops  int64
	errs int64
	err  error // the first error
}

func (e *env) fleetRun(ctx context.Context, clients int, cfg leasetable.Config) (sample, error) {
	return e.fleetRunWith(ctx, clients, func(pool *pgxpool.Pool, owner string) (fleetAPI, error) {
		cc := cfg
		cc.Owner = owner
		c, err := leasetable.New(ctx, pool, cc)
		if err != nil {
			return nil, err
		}
		if ri := c.Config().RenewInterval; ri > fleetKeepAlive {
			// The warm-up would end before the first keep-alive, and the
			// window would time the pools growing (fleetWarmup).
			_ = c.Close(ctx)
			return nil, fmt.Errorf("the clients' RenewInterval %s is longer than the warm-up allows for (%s)", ri, fleetKeepAlive)
		}
		return clientFleet{c}, nil
	})
}

// fleetRunWith runs a fleet whose members newMember makes on their pools.
func (e *env) fleetRunWith(ctx context.Context, clients int, newMember func(pool *pgxpool.Pool, owner string) (fleetAPI, error)) (sample, error) {
	mon, err := e.newMonitor(ctx, "bench-monitor")
	if err != nil {
		return nil, err
	}
	defer mon.close(ctx)
	if err := settle(ctx, mon); err != nil {
		return nil, err
	}
	run := fleetRuns.Add(1)
	prefix := fmt.Sprintf("bench-fleet-%d", run)
	shared := make([]string, fleetNames(clients))
	for i := range shared {
		shared[i] = fmt.Sprintf("%s/lease/%d", prefix, i)
	}
	group := prefix + "/items"

	// Open the fleet (not timed).
	fleet := make([]*fleetClient, clients)
	defer func() {
		// Close them all, then remove the rows of this run (not timed).
		cctx := context.WithoutCancel(ctx)
		_ = parallel(fleetOpeners, func(w int) error {
			for i := w; i < clients; i += fleetOpeners {
				if f := fleet[i]; f != nil {
					f.api.close(cctx)
					f.pool.Close()
				}
			}
			return nil
		})
		var n int
		_ = mon.queryRow(cctx, "WITH d AS (DELETE FROM pgbaton.lease WHERE name LIKE $1 RETURNING 1) SELECT count(*) FROM d",
			[]any{prefix + "/%"}, &n)
	}()
	err = parallel(fleetOpeners, func(w int) error {
		for i := w; i < clients; i += fleetOpeners {
			id := fmt.Sprintf("%s-%d", prefix, i)
			pool, err := e.pool(ctx, id, fleetMaxConns)
			if err != nil {
				return err
			}
			if err := openConns(ctx, pool, e.fleetOpen); err != nil {
				pool.Close()
				return err
			}
			api, err := newMember(pool, id)
			if err != nil {
				pool.Close()
				return err
			}
			fleet[i] = &fleetClient{pool: pool, api: api}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	// The clients start at random instants within two pauses, as pods
	// do, and run a warm-up first (not measured); then the window.
	from := time.Now().Add(e.fleetWarmup())
	end := from.Add(e.fleetWindow)
	wctx, stop := context.WithDeadline(ctx, end)
	defer stop()
	var wg sync.WaitGroup
	for i, f := range fleet {
		wg.Go(func() { f.loop(wctx, i, shared, group, e.fleetPause, from, end) })
	}
	select {
	case <-time.After(time.Until(from)):
	case <-ctx.Done():
		wg.Wait()
		return nil, ctx.Err()
	}
	opened0 := fleetNewConns(fleet)
	a, err := mon.sample(ctx)
	if err != nil {
		stop()
		wg.Wait()
		return nil, err
	}
	var peakTotal, peakOne int
	sampled := make(chan error, 1)
	go func() { sampled <- sampleFleetConns(ctx, wctx.Done(), mon, prefix, &peakTotal, &peakOne) }()
	<-wctx.Done()
	opened := fleetNewConns(fleet) - opened0
	b, err := mon.sample(ctx)
	wg.Wait()
	if serr := <-sampled; err == nil {
		err = serr
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, err
	}

	u := between(a, b)
	var lat []time.Duration
	var ops, errs int64
	var first error
	for _, f := range fleet {
		lat = append(lat, f.lat...)
		ops += f.ops
		errs += f.errs
		if first == nil {
			first = f.err
		}
	}
	if ops == 0 {
		return nil, fmt.Errorf("no operation succeeded: %v", first)
	}
	if first != nil {
		e.logf("  %s: %d errors, the first: %v", prefix, errs, first)
	}
	p50, p99 := percentiles(lat)
	opsPerSec := float64(ops) / e.fleetWindow.Seconds()
	return sample{"ops/s": opsPerSec, "acquire p50 ms": p50, "acquire p99 ms": p99,
		"conns/client": float64(peakTotal) / float64(clients), "max conns/client": float64(peakOne),
		"conns opened/client": float64(opened) / float64(clients),
		// Rates, not counts: the monitor's samples are answered a moment
		// after the window's ends, later at its start on a saturated server.
		"commits/call": u.commitsPerSec / opsPerSec, "writes/call": u.writesPerSec / opsPerSec,
		"server CPU %": u.serverCPU, "client CPU %": u.clientCPU, "machine CPU %": u.machineCPU, "steal %": u.stealCPU,
		"errors": float64(errs)}, nil
}

// openConns has pool open n connections now (-fleetopen), held at once
// and released, so that the fleet's loop starts with them open.
func openConns(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// fleetNewConns is how many connections the fleet's pools have opened.
func fleetNewConns(fleet []*fleetClient) int64 {
	var n int64
	for _, f := range fleet {
		n += f.pool.Stat().NewConnsCount()
	}
	return n
}

// fleetWarmup is how long the fleet runs before the window: every
// client has started, made a round and kept its lease session alive
// once (fleetKeepAlive). A pgbaton client's own statements (the
// keep-alive, removing a registration given up) could run beside its
// caller's calls, and its pool opened its second connection then, early
// in its life. A warm-up shorter than the first keep-alive left that to the
// window: with 500 clients on 2 cores, 0.8-0.9 connections opened per
// client in it (about 45 backend starts a second on the server) and 0.32
// to 0.45 of raw pgx's calls/s; with this warm-up, 0.1-0.2 opened and
// 0.66-0.92 of raw pgx (two interleaved pairs of runs).
func (e *env) fleetWarmup() time.Duration { return 2*e.fleetPause + fleetKeepAlive + time.Second }

// fleetKeepAlive is leasetable's default RenewInterval (TTL 15s / 3),
// which the fleet's clients use; fleetRun refuses clients whose
// RenewInterval is longer.
const fleetKeepAlive = 5 * time.Second

// loop is one client's churn until ctx ends; calls count if they end
// between from and end, acquire latencies if the call also began after
// from.
func (f *fleetClient) loop(ctx context.Context, i int, shared []string, group string, pause time.Duration, from, end time.Time) {
	rng := rand.New(rand.NewPCG(uint64(i), uint64(len(shared))))
	seq := 0
	sleep := func() {
		if pause > 0 {
			select {
			case <-time.After(time.Duration(rng.Int64N(int64(2 * pause)))):
			case <-ctx.Done():
			}
		}
	}
	sleep()
	// done records the result of one call.
	done := func(err error) bool {
		switch now := time.Now(); {
		case ctx.Err() != nil || now.Before(from) || now.After(end):
			return false
		case err != nil:
			f.errs++
			if f.err == nil {
				f.err = err
			}
			return false
		}
		f.ops++
		return true
	}
	for ctx.Err() == nil {
		name := shared[rng.IntN(len(shared))]
		actx, cancel := context.WithTimeout(ctx, fleetWaitLimit)
		start := time.Now()
		release, renew, err := f.api.acquire(actx, name)
		took := time.Since(start)
		cancel()
		if done(err) && !start.Before(from) {
			f.lat = append(f.lat, took)
		}
		if err == nil {
			done(renew(ctx))
			done(release(ctx))
		}
		items := make([]string, fleetItems)
		for k := range items {
			seq++
			items[k] = fmt.Sprintf("%s/%d-%d", group, i, seq)
		}
		done(f.api.register(ctx, group, items))
		f.api.claimComplete(ctx, group, fleetItems, done)
		sleep()
	}
}

// sampleFleetConns counts the fleet's server connections by client until
// stop is closed: the pool's connections carry the client's id as
// application_name, the LISTEN connection "pgbaton lease listener <owner>".
func sampleFleetConns(ctx context.Context, stop <-chan struct{}, mon *monitor, prefix string, peakTotal, peakOne *int) error {
	t := time.NewTicker(fleetSampleEvery)
	defer t.Stop()
	for {
		total := 0
		err := mon.query(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "+
			"application_name LIKE $1 GROUP BY substring(application_name from $2)",
			[]any{"%" + prefix + "-%", prefix + "-[0-9]+"}, func(r pgx.Rows) error {
				var n int
				if err := r.Scan(&n); err != nil {
					return err
				}
				total += n
				*peakOne = max(*peakOne, n)
				return nil
			})
		if err != nil {
			return err
		}
		*peakTotal = max(*peakTotal, total)
		select {
		case <-t.C:
		case <-stop:
			return nil
		}
	}
}
