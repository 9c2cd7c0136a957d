//go:build ha

package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/test/check"
)

// The workload's shape and timings. Every client has its own pool on the
// one multi-host URL, as separate application instances would.
const (
	leaseTTL        = 2 * time.Second
	pingInterval    = 500 * time.Millisecond
	pingTimeout     = time.Second
	leaseWorkers    = 3
	leaseKeys       = 2
	writesPerGrant  = 3
	leaseThink      = 50 * time.Millisecond // between a release and the next acquire
	advisoryLockers = 2
	claimers        = 2
	campaigners     = 2
	feedEvery       = 200 * time.Millisecond
	feedBatch       = 8 // work items registered per feedEvery, about what the claimers do
)

// client is one application instance of the workload: what it got done
// and what went wrong, for the liveness figures and the report.
type client struct {
	name  string
	kind  string // lease, advisory, claim, election, feeder
	procs []int  // its procs in the history
	// group, when set, is the client its successes count for: the
	// election's campaigners count as one client, as only one of them
	// leads at a time.
	group *client

	mu    sync.Mutex
	ok    []int64        // MonoNow of every successful acquire (claim, election)
	errs  map[string]int // errors and logged warnings, by message
	trace []traced       // the library's debug log, with PGBATON_HA_TRACE set
}

// traced is one debug log record of a client's library.
type traced struct {
	at  int64 // MonoNow
	msg string
}

func (c *client) success(at int64) {
	if c.group != nil {
		c.group.success(at)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ok = append(c.ok, at)
}

func (c *client) failed(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs[shorten(err.Error())]++
}

// counts reports whether the client's own successes count for liveness:
// not the feeder's (it stops before the lag phase's fault), nor a
// holder's (the pinned one never reaches a new primary, the roaming one
// gets the lease only once the pinned one lost it), nor a campaigner's
// (its election counts).
func (c *client) counts() bool { return c.kind != "feeder" && c.kind != "holder" && c.group == nil }

// firstOKAfter is the first success after t, or 0.
func (c *client) firstOKAfter(t int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, at := range c.ok {
		if at > t {
			return at
		}
	}
	return 0
}

// shorten keeps error messages comparable across occurrences: no pids,
// ports or tokens.
func shorten(s string) string {
	var b strings.Builder
	digits := false
	for _, r := range s {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	out := b.String()
	if len(out) > 160 {
		out = out[:160] + "…"
	}
	return out
}

// errorLog is a slog handler that counts a client's warnings and errors
// (lost leases, failed renewals, lost sessions) as the client's errors.
// With PGBATON_HA_TRACE set it also keeps every debug record, to show
// what the slowest client was doing after a fault.
type errorLog struct{ c *client }

var traceLib = os.Getenv("PGBATON_HA_TRACE") != ""

func (h errorLog) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || traceLib
}

func (h errorLog) Handle(_ context.Context, r slog.Record) error {
	if traceLib {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		h.c.mu.Lock()
		h.c.trace = append(h.c.trace, traced{at: check.MonoNow(), msg: b.String()})
		h.c.mu.Unlock()
	}
	if r.Level < slog.LevelWarn {
		return nil
	}
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			msg += ": " + a.Value.String()
		}
		return true
	})
	h.c.failed(errors.New(msg))
	return nil
}
func (h errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h errorLog) WithGroup(string) slog.Handler      { return h }

// notice is a holder learning that its lock, lease or leadership is lost.
type notice struct {
	Kind    string
	Proc    int
	Key     string
	Granted int64 // MonoNow of the grant
	Told    int64 // MonoNow when Done closed
}

// workload runs every kind of client against one phase's names and
// tables until stopped.
type workload struct {
	url       string
	pinnedURL string // the phase's first leader only, for the pinned holder
	phase     int
	ledger    pgx.Identifier // (key, token, op_id, seq), appended under lease tokens
	head      pgx.Identifier // per-key counter giving the ledger's commit order
	group     string         // the work items' lease group
	hist      *check.History

	mu      sync.Mutex
	clients []*client
	notices []notice
	spans   []span // the holders'

	// registered are the work items whose registration was acknowledged
	// and is on the standby (see feed): those a failover may not lose.
	registered []string

	stopping  atomic.Bool   // finish the round and return
	feedStop  chan struct{} // the feeder stops registering items
	claimStop chan struct{} // claimers stop (after the drain)
	wg, cwg   sync.WaitGroup
	fwg       sync.WaitGroup
}

func (w *workload) key(format string, args ...any) string {
	return fmt.Sprintf("ha:p%d:", w.phase) + fmt.Sprintf(format, args...)
}

func (w *workload) newClient(kind string, i int) *client {
	c := &client{name: fmt.Sprintf("p%d-%s-%d", w.phase, kind, i), kind: kind, errs: map[string]int{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clients = append(w.clients, c)
	return c
}

func (w *workload) notify(n notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notices = append(w.notices, n)
}

func (w *workload) snapshotNotices() []notice {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]notice(nil), w.notices...)
}

func (w *workload) pool(ctx context.Context, c *client) (*pgxpool.Pool, error) {
	return w.poolAt(ctx, c, w.url)
}

// poolAt is c's pool on url.
func (w *workload) poolAt(ctx context.Context, c *client, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = c.name
	cfg.ConnConfig.ConnectTimeout = time.Second
	cfg.MaxConns = 4
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (w *workload) emit(ev check.Event) {
	if ev.Mono == 0 {
		ev.Mono = check.MonoNow()
	}
	w.hist.Add(ev)
}

// start launches every client. Each runs until stop (claimers until
// stopClaims) or ctx ends.
func (w *workload) start(ctx context.Context) error {
	w.claimStop, w.feedStop = make(chan struct{}), make(chan struct{})
	feeder := w.newClient("feeder", 0)
	fpool, err := w.pool(ctx, feeder)
	if err != nil {
		return err
	}
	w.fwg.Go(func() {
		defer fpool.Close()
		w.feed(ctx, feeder, fpool)
	})
	type starter struct {
		n     int
		run   func(context.Context, *client, int, *pgxpool.Pool) error
		k     string
		cwg   bool
		procs func(i int) []int
	}
	election := w.newClient("election", 0)
	for _, s := range []starter{
		{leaseWorkers, w.leaseWorker, "lease", false, func(i int) []int { return []int{1 + i} }},
		{advisoryLockers, w.advisoryLocker, "advisory", false, func(i int) []int { return []int{100 + 2*i, 101 + 2*i} }},
		{campaigners, w.campaigner, "campaigner", false, func(i int) []int { return []int{301 + i} }},
		{claimers, w.claimer, "claim", true, func(i int) []int { return []int{201 + i} }},
	} {
		for i := range s.n {
			c := w.newClient(s.k, i)
			c.procs = s.procs(i)
			if s.k == "campaigner" {
				c.group = election
				election.procs = append(election.procs, c.procs...)
			}
			pool, err := w.pool(ctx, c)
			if err != nil {
				return err
			}
			wg := &w.wg
			if s.cwg {
				wg = &w.cwg
			}
			wg.Go(func() {
				defer pool.Close()
				if err := s.run(ctx, c, i, pool); err != nil && ctx.Err() == nil {
					c.failed(fmt.Errorf("client ended: %w", err))
				}
			})
		}
	}
	return w.startHolders(ctx)
}

// stopFeeding stops the registration of new work items.
func (w *workload) stopFeeding() {
	select {
	case <-w.feedStop:
	default:
		close(w.feedStop)
	}
	w.fwg.Wait()
}

// feed registers feedBatch new work items every feedEvery until
// stopFeeding, keeping the claimers busy through the fault.
//
// A batch counts as registered (every item must be done exactly once)
// once the standby has it too, not at the acknowledgement: with
// asynchronous replication a primary killed right after acknowledging a
// commit takes it with it, as the database allows (the lag phase stops
// feeding before its fault for that reason; the failover phase feeds
// through it, and a busy machine, whose standby replays late, widens the
// window: a failover phase once reported exactly one batch never done,
// ha:p2:item:00072-79, and drained, the shape of a lost commit). A batch
// whose replication cannot be confirmed, the primary gone first, is not
// counted (it may be lost or done), and is logged as the feeder's error.
func (w *workload) feed(ctx context.Context, c *client, pool *pgxpool.Pool) {
	lc, err := newLeaseClient(ctx, pool, c)
	if err != nil {
		c.failed(err)
		return
	}
	defer lc.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(feedEvery)
	defer tick.Stop()
	for n := 0; ; {
		names := make([]string, feedBatch)
		for i := range names {
			names[i] = w.key("item:%05d", n+i)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		before, err := primaryOf(rctx, pool)
		if err == nil {
			_, err = lc.Register(rctx, w.group, names...)
		}
		cancel()
		if err == nil {
			n += feedBatch
			c.success(check.MonoNow())
			if rerr := replicated(ctx, pool, before); rerr != nil {
				c.failed(fmt.Errorf("registration acknowledged but not confirmed on the standby, not counted: %w", rerr))
			} else {
				w.mu.Lock()
				w.registered = append(w.registered, names...)
				w.mu.Unlock()
			}
		}
		c.failed(err)
		select {
		case <-ctx.Done():
			return
		case <-w.feedStop:
			return
		case <-tick.C:
		}
	}
}

// primaryOf is the primary pool reaches.
func primaryOf(ctx context.Context, pool *pgxpool.Pool) (primary, error) {
	var p primary
	if err := pool.QueryRow(ctx, "SELECT inet_server_port(), pg_postmaster_start_time()").Scan(&p.Port, &p.Started); err != nil {
		return p, fmt.Errorf("which primary: %w", err)
	}
	return p, nil
}

// replicated waits until every commit the primary p acknowledged so far
// is flushed by each of its standbys (a standby promoted later replays
// everything it flushed), polling for up to two seconds. It fails if the
// pool reaches another primary, or p restarted: what p acknowledged
// before may be lost.
func replicated(ctx context.Context, pool *pgxpool.Pool, p primary) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var lsn string
	var now primary
	if err := pool.QueryRow(ctx, "SELECT inet_server_port(), pg_postmaster_start_time(), pg_current_wal_lsn()::text").Scan(&now.Port, &now.Started, &lsn); err != nil {
		return err
	}
	for {
		if !now.same(p) {
			return fmt.Errorf("the primary changed from port %d to %d", p.Port, now.Port)
		}
		var flushed, standbys int
		err := pool.QueryRow(ctx, `SELECT inet_server_port(), pg_postmaster_start_time(),
				count(*) FILTER (WHERE flush_lsn >= $1::pg_lsn), count(*)
			FROM pg_stat_replication`, lsn).Scan(&now.Port, &now.Started, &flushed, &standbys)
		switch {
		case err != nil:
			return err
		case standbys > 0 && flushed == standbys && now.same(p):
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d standbys flushed %s: %w", flushed, standbys, lsn, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stop ends every client but the claimers, after their current round.
func (w *workload) stop() {
	w.stopFeeding()
	w.stopping.Store(true)
	w.wg.Wait()
}

// stopClaims ends the claimers.
func (w *workload) stopClaims() {
	close(w.claimStop)
	w.cwg.Wait()
}

func sleepUnless(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// outcome classifies a failed acquire: fail when the library promises
// nothing was granted (its context ended), unknown otherwise.
func outcome(err error) string {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return check.EvFail
	}
	return check.EvUnknown
}

func newLeaseClient(ctx context.Context, pool *pgxpool.Pool, c *client) (*leasetable.Client, error) {
	return leasetable.New(ctx, pool, leasetable.Config{Owner: c.name, TTL: leaseTTL, Logger: slog.New(errorLog{c})})
}

// watchLease records the holder's notice when a lease is lost.
func (w *workload) watchLease(kind string, proc int, l *leasetable.Lease, granted int64) {
	go func() {
		<-l.Done()
		if errors.Is(l.Err(), leasetable.ErrLeaseLost) {
			w.notify(notice{Kind: kind, Proc: proc, Key: l.Name(), Granted: granted, Told: check.MonoNow()})
		}
	}()
}

// leaseWorker loops acquire → fenced ledger writes → release on the
// phase's contended lease keys, like the chaos suite's workers.
func (w *workload) leaseWorker(ctx context.Context, c *client, i int, pool *pgxpool.Pool) error {
	lc, err := newLeaseClient(ctx, pool, c)
	if err != nil {
		return err
	}
	defer lc.Close(context.WithoutCancel(ctx))
	proc := 1 + i
	rng := rand.New(rand.NewPCG(uint64(w.phase), uint64(proc)))
	for n := 0; !w.stopping.Load() && ctx.Err() == nil; n++ {
		key := w.key("lease:%d", rng.IntN(leaseKeys))
		w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvInvoke})
		actx, cancel := context.WithTimeout(ctx, 2*leaseTTL)
		l, err := lc.Acquire(actx, key)
		cancel()
		if err != nil {
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: outcome(err), Err: err.Error()})
			c.failed(err)
			sleepUnless(ctx, 50*time.Millisecond)
			continue
		}
		granted := check.MonoNow()
		w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvOK, Mono: granted, Token: l.Token()})
		c.success(granted)
		w.watchLease("lease", proc, l, granted)
		lastValid := granted
		for j := range writesPerGrant {
			t := check.MonoNow()
			if l.Err() != nil || !time.Now().Before(l.Deadline()) {
				break
			}
			lastValid = t
			id := fmt.Sprintf("%s-%d-%d", c.name, n, j)
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpWrite, Type: check.EvInvoke, Mono: t, Token: l.Token(), OpID: id})
			typ, err := w.ledgerWrite(ctx, pool, l, id)
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpWrite, Type: typ, Token: l.Token(), OpID: id, Err: errString(err)})
			c.failed(err)
			sleepUnless(ctx, time.Duration(rng.Int64N(int64(100*time.Millisecond))))
		}
		if t := check.MonoNow(); l.Err() == nil && time.Now().Before(l.Deadline()) {
			lastValid = t
		}
		w.emit(check.Event{Proc: proc, Key: key, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: l.Token()})
		rctx, cancel := context.WithTimeout(ctx, leaseTTL)
		err = l.Release(rctx)
		cancel()
		typ := releaseType(err)
		if typ == check.EvUnknown {
			c.failed(err)
		}
		w.emit(check.Event{Proc: proc, Key: key, Op: check.OpRelease, Type: typ, Token: l.Token(), Err: errString(err)})
		// A worker does something else between grants. Without it, the
		// releaser takes the key straight back before the woken waiter
		// looks, and a worker's first grant after a failover measures
		// its luck rather than the failover.
		sleepUnless(ctx, leaseThink)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ledgerWrite appends one row to the phase's ledger under the lease,
// fenced by fencedwrite.InTx.
func (w *workload) ledgerWrite(ctx context.Context, pool *pgxpool.Pool, l *leasetable.Lease, id string) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, leaseTTL)
	defer cancel()
	err := fencedwrite.InTx(wctx, pool, l, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(wctx, "UPDATE "+w.head.Sanitize()+" SET seq = seq + 1 WHERE key = $1 RETURNING seq", l.Name()).Scan(&seq); err != nil {
			return err
		}
		_, err := tx.Exec(wctx, "INSERT INTO "+w.ledger.Sanitize()+" (key, token, op_id, seq) VALUES ($1, $2, $3, $4)", l.Name(), l.Token(), id, seq)
		return err
	})
	switch {
	case err == nil:
		return check.EvOK, nil
	case errors.Is(err, fencedwrite.ErrCommitUnknown):
		return check.EvUnknown, err
	default:
		return check.EvFail, err
	}
}

// advisoryLocker keeps one private session lock held (so that a lock is
// held whenever a fault strikes, and its loss is noticed), and cycles a
// lock contended with the other lockers.
func (w *workload) advisoryLocker(ctx context.Context, c *client, i int, pool *pgxpool.Pool) error {
	locker, err := advisory.New(pool, advisory.Config{PingInterval: pingInterval, PingTimeout: pingTimeout, Logger: slog.New(errorLog{c})})
	if err != nil {
		return err
	}
	defer locker.Close(context.WithoutCancel(ctx))
	var keep sync.WaitGroup
	keep.Go(func() {
		w.lockLoop(ctx, c, 100+2*i, w.key("advisory:own:%d", i), locker, func() time.Duration { return 0 })
	})
	defer keep.Wait()
	proc := 101 + 2*i
	rng := rand.New(rand.NewPCG(uint64(w.phase), uint64(proc)))
	w.lockLoop(ctx, c, proc, w.key("advisory:shared"), locker, func() time.Duration {
		return time.Duration(100+rng.IntN(300)) * time.Millisecond
	})
	return nil
}

// lockLoop locks key, holds it for hold() (0: until the workload stops)
// or until it is lost, and goes round again until the workload stops.
func (w *workload) lockLoop(ctx context.Context, c *client, proc int, key string, locker *advisory.Locker, hold func() time.Duration) {
	for !w.stopping.Load() && ctx.Err() == nil {
		w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvInvoke})
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lk, err := locker.Lock(lctx, advisory.Name(key))
		cancel()
		if err != nil {
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: outcome(err), Err: err.Error()})
			c.failed(err)
			sleepUnless(ctx, 50*time.Millisecond)
			continue
		}
		w.holdLock(ctx, c, proc, key, lk, hold())
	}
}

// holdLock records a granted session lock, holds it for d (0: until the
// workload stops) or until it is lost, and unlocks it.
func (w *workload) holdLock(ctx context.Context, c *client, proc int, key string, lk *advisory.Lock, d time.Duration) {
	granted := check.MonoNow()
	w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvOK, Mono: granted})
	c.success(granted)
	lastValid := granted
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(d)
	for (d == 0 || time.Now().Before(end)) && !w.stopping.Load() && ctx.Err() == nil {
		select {
		case <-lk.Done():
		case <-tick.C:
		}
		if lk.Err() != nil {
			break
		}
		lastValid = check.MonoNow()
	}
	if errors.Is(lk.Err(), advisory.ErrLockLost) {
		w.notify(notice{Kind: "advisory", Proc: proc, Key: key, Granted: granted, Told: check.MonoNow()})
	} else if t := check.MonoNow(); lk.Err() == nil {
		lastValid = t
	}
	w.emit(check.Event{Proc: proc, Key: key, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid})
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	err := lk.Unlock(uctx)
	cancel()
	typ := check.EvOK
	switch {
	case err == nil:
	case errors.Is(err, advisory.ErrLockLost):
		typ = check.EvFail
	default:
		typ = check.EvUnknown
		c.failed(err)
	}
	w.emit(check.Event{Proc: proc, Key: key, Op: check.OpRelease, Type: typ, Err: errString(err)})
}

// campaigner runs leasetable's Campaign for the phase's election; each
// term lasts about a second, then the leader resigns.
func (w *workload) campaigner(ctx context.Context, c *client, i int, pool *pgxpool.Pool) error {
	lc, err := newLeaseClient(ctx, pool, c)
	if err != nil {
		return err
	}
	defer lc.Close(context.WithoutCancel(ctx))
	proc := 301 + i
	key := w.key("leader")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for !w.stopping.Load() && cctx.Err() == nil {
			sleepUnless(cctx, 20*time.Millisecond)
		}
		cancel()
	}()
	w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvInvoke})
	err = lc.Campaign(cctx, key, c.name, leasetable.Callbacks{
		OnStartedLeading: func(lctx context.Context, term int64) {
			granted := check.MonoNow()
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvOK, Mono: granted, Token: term})
			c.success(granted)
			lastValid := granted
			end := time.Now().Add(time.Second)
			for time.Now().Before(end) && lctx.Err() == nil {
				sleepUnless(lctx, 20*time.Millisecond)
				if lctx.Err() == nil {
					lastValid = check.MonoNow()
				}
			}
			if errors.Is(context.Cause(lctx), leasetable.ErrLeaseLost) {
				w.notify(notice{Kind: "election", Proc: proc, Key: key, Granted: granted, Told: check.MonoNow()})
			}
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: term})
		},
		OnStoppedLeading: func() {
			// Campaign has resigned (or the term was lost) and campaigns
			// again.
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpRelease, Type: check.EvOK})
			w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvInvoke})
		},
	})
	// The last campaign never ended in a grant.
	w.emit(check.Event{Proc: proc, Key: key, Op: check.OpAcquire, Type: check.EvFail})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// claimer claims the phase's work items one at a time, records each as
// done in ha_item_done under the item's lease (an idempotent consumer: an
// item already done is not done again) and completes it.
func (w *workload) claimer(ctx context.Context, c *client, i int, pool *pgxpool.Pool) error {
	lc, err := newLeaseClient(ctx, pool, c)
	if err != nil {
		return err
	}
	defer lc.Close(context.WithoutCancel(ctx))
	proc := 201 + i
	rng := rand.New(rand.NewPCG(uint64(w.phase), uint64(proc)))
	for ctx.Err() == nil {
		select {
		case <-w.claimStop:
			return nil
		default:
		}
		w.emit(check.Event{Proc: proc, Op: check.OpAcquire, Type: check.EvInvoke})
		cctx, cancel := context.WithTimeout(ctx, leaseTTL)
		leases, err := lc.Claim(cctx, w.group, 1)
		cancel()
		if err != nil {
			w.emit(check.Event{Proc: proc, Op: check.OpAcquire, Type: outcome(err), Err: err.Error()})
			c.failed(err)
			sleepUnless(ctx, 50*time.Millisecond)
			continue
		}
		if len(leases) == 0 {
			w.emit(check.Event{Proc: proc, Op: check.OpAcquire, Type: check.EvFail})
			sleepUnless(ctx, 100*time.Millisecond)
			continue
		}
		l := leases[0]
		granted := check.MonoNow()
		w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpAcquire, Type: check.EvOK, Mono: granted, Token: l.Token()})
		c.success(granted)
		w.watchLease("claim", proc, l, granted)
		sleepUnless(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond) // the work
		lastValid := granted
		t := check.MonoNow()
		if l.Err() != nil || !time.Now().Before(l.Deadline()) {
			// Lost, or past its deadline (a busy machine, or a claim
			// answered late in a failover), before it was recorded
			// done: not done, so given back for another claim. A
			// Complete would delete the item by its token, which the
			// database still takes when nobody claimed the item since,
			// expired or not (a failover's grace lets nobody claim it):
			// an item completed and never done.
			w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: l.Token()})
			rctx, cancel := context.WithTimeout(ctx, leaseTTL)
			err = l.Release(rctx)
			cancel()
			w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpRelease, Type: releaseType(err), Token: l.Token(), Err: errString(err)})
			continue
		}
		lastValid = t
		id := fmt.Sprintf("%s-%s", c.name, l.Name())
		w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpWrite, Type: check.EvInvoke, Mono: t, Token: l.Token(), OpID: id})
		wctx, cancel := context.WithTimeout(ctx, leaseTTL)
		err = fencedwrite.InTx(wctx, pool, l, func(tx pgx.Tx) error {
			_, err := tx.Exec(wctx, `INSERT INTO ha_item_done (item, token, worker)
				SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM ha_item_done WHERE item = $1)`, l.Name(), l.Token(), c.name)
			return err
		})
		cancel()
		typ := check.EvOK
		if err != nil {
			typ = check.EvFail
			if errors.Is(err, fencedwrite.ErrCommitUnknown) {
				typ = check.EvUnknown
			}
		}
		w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpWrite, Type: typ, Token: l.Token(), OpID: id, Err: errString(err)})
		c.failed(err)
		if err != nil {
			// Not done: give it back for another claim.
			w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpRelease, Type: check.EvInvoke, Mono: t, Token: l.Token()})
			rctx, cancel := context.WithTimeout(ctx, leaseTTL)
			err = l.Release(rctx)
			cancel()
			w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpRelease, Type: releaseType(err), Token: l.Token(), Err: errString(err)})
			continue
		}
		w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: l.Token()})
		rctx, cancel := context.WithTimeout(ctx, leaseTTL)
		err = l.Complete(rctx)
		cancel()
		if err != nil && !errors.Is(err, leasetable.ErrNotHeld) && !errors.Is(err, leasetable.ErrLeaseLost) {
			c.failed(err)
		}
		w.emit(check.Event{Proc: proc, Key: l.Name(), Op: check.OpRelease, Type: releaseType(err), Token: l.Token(), Err: errString(err)})
	}
	return nil
}

func releaseType(err error) string {
	switch {
	case err == nil:
		return check.EvOK
	case errors.Is(err, leasetable.ErrNotHeld) || errors.Is(err, leasetable.ErrLeaseLost):
		return check.EvFail
	default:
		return check.EvUnknown
	}
}

// errorSummary lists what went wrong in the clients, most frequent first.
func (w *workload) errorSummary(limit int) []string {
	counts := map[string]int{}
	w.mu.Lock()
	for _, c := range w.clients {
		c.mu.Lock()
		for msg, n := range c.errs {
			counts[c.kind+": "+msg] += n
		}
		c.mu.Unlock()
	}
	w.mu.Unlock()
	out := make([]string, 0, len(counts))
	for msg := range counts {
		out = append(out, msg)
	}
	sort.Slice(out, func(i, j int) bool { return counts[out[i]] > counts[out[j]] })
	if len(out) > limit {
		out = out[:limit]
	}
	for i, msg := range out {
		out[i] = fmt.Sprintf("%5d× %s", counts[msg], msg)
	}
	return out
}
