package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/leasetable"
)

// leaseBackends are the TTL lock implementations compared: pgbaton's
// leases (a row with an expiry and a fencing token, written with
// synchronous_commit on), raw pgx calling the same SQL functions, and a
// Redis lock with the same TTL.
func (e *env) leaseBackends(ttl time.Duration) []*lockBackend {
	return []*lockBackend{
		{name: "pgbaton leasetable.Client", newNode: func(ctx context.Context) (lockNode, error) { return e.newLeaseNode(ctx, ttl) }},
		{name: "raw pgx (same SQL functions)", app: "bench-raw-lease", newNode: func(context.Context) (lockNode, error) {
			return &rawLeaseNode{e: e, ttlMs: ttl.Milliseconds()}, nil
		}},
		{name: "redislock (Redis SET NX PX)", skip: e.redisSkip, newNode: func(ctx context.Context) (lockNode, error) {
			n, err := e.newRedisNode(ctx)
			if err == nil {
				n.(*redisNode).ttl = ttl
			}
			return n, err
		}},
	}
}

// --- pgbaton leases: one Client per process, shared by its goroutines.

type leaseNode struct {
	e       *env
	pool    *pgxpool.Pool
	c       *leasetable.Client
	waiting chan struct{} // a debug log line says an Acquire waits
}

func (e *env) newLeaseNode(ctx context.Context, ttl time.Duration) (lockNode, error) {
	pool, err := e.pool(ctx, "bench-pgbaton-lease", 8) // as many connections as raw pgx uses at 8 clients
	if err != nil {
		return nil, err
	}
	n := &leaseNode{e: e, pool: pool, waiting: make(chan struct{}, 1)}
	n.c, err = leasetable.New(ctx, pool, leasetable.Config{TTL: ttl, Logger: slog.New(waitHook{msg: "pgbaton: waiting for lease", ch: n.waiting})})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return n, nil
}

// waitHook turns the client's log line msg ("waiting for lease", "waiting
// to claim") into a signal, so a latency benchmark knows the waiter is
// blocked.
type waitHook struct {
	msg string
	ch  chan struct{}
}

func (h waitHook) Enabled(_ context.Context, l slog.Level) bool { return true }
func (h waitHook) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h waitHook) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h waitHook) WithGroup(string) slog.Handler      { return h }

func (n *leaseNode) worker(context.Context) (lockWorker, error) { return n, nil }
func (n *leaseNode) conns(ctx context.Context) (float64, error) {
	return n.e.serverConns(ctx, "bench-pgbaton-lease")
}
func (n *leaseNode) waitSignal() <-chan struct{} { return n.waiting }

func (n *leaseNode) try(ctx context.Context, key string) (held, error) {
	l, err := n.c.TryAcquire(ctx, key)
	if errors.Is(err, leasetable.ErrHeld) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return releaseFunc(l.Release), nil
}

func (n *leaseNode) lock(ctx context.Context, key string) (held, error) {
	select { // a stale signal from an earlier wait
	case <-n.waiting:
	default:
	}
	l, err := n.c.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return releaseFunc(l.Release), nil
}

func (n *leaseNode) close(ctx context.Context) error {
	err := n.c.Close(ctx)
	n.pool.Close()
	return err
}

// --- raw pgx leases: a connection per goroutine calling the protocol
// functions; a waiter LISTENs on the same channel pgbaton uses.

type rawLeaseNode struct {
	e     *env
	ttlMs int64
	mu    sync.Mutex
	ws    []*rawLeaseWorker
}

type rawLeaseWorker struct {
	c          *pgx.Conn
	owner      string
	ttlMs      int64
	listening  bool
	registered string // lease name this worker is registered as waiter for
	waiting    chan struct{}
}

func (n *rawLeaseNode) worker(ctx context.Context) (lockWorker, error) {
	c, err := n.e.conn(ctx, "bench-raw-lease")
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	w := &rawLeaseWorker{c: c, owner: fmt.Sprintf("bench-raw-%p-%d", n, len(n.ws)), ttlMs: n.ttlMs, waiting: make(chan struct{}, 1)}
	n.ws = append(n.ws, w)
	return w, nil
}

func (n *rawLeaseNode) conns(ctx context.Context) (float64, error) {
	return n.e.serverConns(ctx, "bench-raw-lease")
}

func (n *rawLeaseNode) close(ctx context.Context) error {
	for _, w := range n.ws {
		_ = w.close(ctx)
	}
	return nil
}

func (w *rawLeaseWorker) waitSignal() <-chan struct{} { return w.waiting }

func (w *rawLeaseWorker) attempt(ctx context.Context, key string) (held, error) {
	var ok bool
	var token int64
	// A waiter looks as itself (p_waiter, its registration's id): a free
	// lease goes to the oldest waiter, and an attempt without the id
	// comes after every waiter, its own registration included.
	var waiter *string
	if w.registered == key {
		waiter = &w.owner
	}
	err := w.c.QueryRow(ctx, "SELECT acquired, token FROM pgbaton.lease_attempt($1, $2, $3, p_waiter => $4)", key, w.owner, w.ttlMs, waiter).Scan(&ok, &token)
	if err != nil || !ok {
		return nil, err
	}
	return releaseFunc(func(ctx context.Context) error {
		// A registration as waiter left by lock goes in the same round trip.
		b := &pgx.Batch{}
		if w.registered != "" {
			b.Queue("SELECT pgbaton.stop_waiting($1, $2)", w.registered, w.owner)
			w.registered = ""
		}
		var released, waiters bool
		b.Queue("SELECT released, waiters FROM pgbaton.release($1, $2, $3)", key, w.owner, token).QueryRow(func(r pgx.Row) error { return r.Scan(&released, &waiters) })
		if err := w.c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if !released {
			return errors.New("raw lease: release of a lease not held")
		}
		if waiters {
			// Woken after the release committed, as pgbaton does.
			_, err := w.c.Exec(ctx, "SELECT pgbaton.notify_waiters($1)", []string{key})
			return err
		}
		return nil
	}), nil
}

func (w *rawLeaseWorker) try(ctx context.Context, key string) (held, error) {
	return w.attempt(ctx, key)
}

// lock follows pgbaton's protocol: LISTEN, register as a waiter
// (pgbaton.wait_for), look again, and wait for the release's NOTIFY.
func (w *rawLeaseWorker) lock(ctx context.Context, key string) (held, error) {
	if !w.listening {
		if _, err := w.c.Exec(ctx, "LISTEN pgbaton_lease"); err != nil {
			return nil, err
		}
		w.listening = true
	}
	for {
		h, err := w.attempt(ctx, key)
		if h != nil || err != nil {
			return h, err
		}
		if w.registered == "" {
			if _, err := w.c.Exec(ctx, "SELECT pgbaton.wait_for($1, $2)", key, w.owner); err != nil {
				return nil, err
			}
			w.registered = key
			continue
		}
		select {
		case w.waiting <- struct{}{}:
		default:
		}
		if _, err := w.c.WaitForNotification(ctx); err != nil {
			return nil, err
		}
	}
}

func (w *rawLeaseWorker) close(ctx context.Context) error { return w.c.Close(ctx) }

// --- scenarios

func (e *env) leaseScenarios() []*scenario {
	var s []*scenario
	for _, clients := range []int{1, 8} {
		sc := e.cycleScenario(clients, e.leaseBackends(15*time.Second))
		sc.title = fmt.Sprintf("Lease: try-acquire + release cycle, %d client(s), synchronous_commit on", clients)
		sc.note = "One process; every client takes and releases its own lease name in a loop (two committed, fsynced " +
			"transactions per cycle for Postgres). pgbaton shares one leasetable.Client over a pool; raw pgx calls " +
			"pgbaton.lease_attempt and pgbaton.release on a connection per client; Redis runs without persistence, " +
			"so it promises less. Connections: open to the server during the run."
		s = append(s, sc)
	}
	h := e.handoverScenarioFor(e.leaseBackends(15*time.Second), nil, 0)
	h.title = "Lease: handover latency on release"
	h.note = "Two processes (clients); the waiter is blocked in Acquire (pgbaton and raw pgx wake on the NOTIFY that " +
		"pgbaton.release sends; redislock polls every 1 ms) when the holder releases. Latency: start of the release → " +
		"the waiter holds the lease. Target: pgbaton p50 ≤ 2 ms."
	s = append(s, h)

	ttl := time.Second
	kb := e.leaseBackends(ttl)
	k := e.handoverScenarioFor([]*lockBackend{kb[0], kb[2]}, map[string]string{kb[0].name: "lease-pgbaton", kb[2].name: "lease-redis"}, min(e.killRuns, 3))
	k.title = fmt.Sprintf("Lease: handover latency after SIGKILL of the holder (TTL %s)", ttl)
	k.note = "The holder is a child process, SIGKILLed while the waiter is blocked; a lease (or Redis key) is free only " +
		"when its TTL runs out, so the latency is the rest of the TTL (the waiter sleeps until the known expiry). " +
		"Advisory locks are freed at once (see above)."
	k.runs = 3
	s = append(s, k, e.contendScenario())
	s = append(s, e.claimScenarios()...)
	return append(s, e.claimWaitScenario())
}

func (e *env) holdExtra() []*lockBackend {
	return e.leaseBackends(15 * time.Second)[:1]
}

// childExtra takes a lease in a child process (SIGKILL scenarios).
func childExtra(ctx context.Context, e *env, mode, key string) (held, error) {
	var n lockNode
	var err error
	switch mode {
	case "lease-pgbaton":
		n, err = e.newLeaseNode(ctx, time.Second)
	case "lease-redis":
		n, err = e.newRedisNode(ctx)
		if err == nil {
			n.(*redisNode).ttl = time.Second
		}
	default:
		return nil, fmt.Errorf("unknown child mode %q", mode)
	}
	if err != nil {
		return nil, err
	}
	w, err := n.worker(ctx)
	if err != nil {
		return nil, err
	}
	return w.try(ctx, key)
}
