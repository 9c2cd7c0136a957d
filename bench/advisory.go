package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allisson/go-pglock/v3"
	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgbaton/pgbaton/advisory"
)

// A lock backend as one process would use it: a node (what the process
// opens once: a Locker, a Redis client, a database/sql pool) and workers
// (what each goroutine uses: the node itself, or a pinned connection).
type lockBackend struct {
	name    string
	app     string // application_name of its Postgres connections
	skip    string
	newNode func(ctx context.Context) (lockNode, error)
}

type lockNode interface {
	worker(ctx context.Context) (lockWorker, error)
	// conns is the number of connections the node has open to its server.
	conns(ctx context.Context) (float64, error)
	close(ctx context.Context) error
}

type lockWorker interface {
	// try takes key if it is free: nil, nil when it is held elsewhere.
	try(ctx context.Context, key string) (held, error)
	// lock waits for key.
	lock(ctx context.Context, key string) (held, error)
	close(ctx context.Context) error
}

type held interface {
	release(ctx context.Context) error
}

type releaseFunc func(ctx context.Context) error

func (f releaseFunc) release(ctx context.Context) error { return f(ctx) }

func keyOf(name string) int64 {
	k, err := advisory.NameKey("", name)
	if err != nil {
		panic(err)
	}
	return k
}

// advisoryBackends are the session advisory lock implementations compared.
func (e *env) advisoryBackends() []*lockBackend {
	redisLock := &lockBackend{name: "redislock (Redis SET NX PX)", skip: e.redisSkip, newNode: e.newRedisNode}
	return []*lockBackend{
		{name: "pgbaton advisory.Locker", app: "bench-pgbaton", newNode: e.newPgbatonNode},
		{name: "raw pgx (conn per client)", app: "bench-raw", newNode: e.newRawNode},
		{name: "go-pglock (conn per lock)", app: "bench-pglock", newNode: e.newPglockNode},
		redisLock,
	}
}

// --- pgbaton: one Locker per process, shared by its goroutines.

type pgbatonNode struct {
	e      *env
	app    string
	pool   *pgxpool.Pool
	locker *advisory.Locker
}

func (e *env) newPgbatonNode(ctx context.Context) (lockNode, error) {
	return e.newPgbatonNodeApp(ctx, "bench-pgbaton")
}

func (e *env) newPgbatonNodeApp(ctx context.Context, app string) (*pgbatonNode, error) {
	pool, err := e.pool(ctx, app, 0)
	if err != nil {
		return nil, err
	}
	// The Locker's own connections are named "pgbaton advisory <Owner>".
	l, err := advisory.New(pool, advisory.Config{Owner: app})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &pgbatonNode{e: e, app: app, pool: pool, locker: l}, nil
}

func (n *pgbatonNode) worker(context.Context) (lockWorker, error) { return n, nil }

// conns counts the connections the Locker took for its sessions (they
// carry its application_name). The idle connections left in the pool
// (used once per name for the registry) serve the application's other
// queries and are not counted.
func (n *pgbatonNode) conns(ctx context.Context) (float64, error) {
	return n.e.serverConns(ctx, "pgbaton advisory "+n.app)
}

func (n *pgbatonNode) try(ctx context.Context, key string) (held, error) {
	lk, err := n.locker.TryLock(ctx, advisory.Name(key))
	if errors.Is(err, advisory.ErrLocked) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return releaseFunc(lk.Unlock), nil
}

func (n *pgbatonNode) lock(ctx context.Context, key string) (held, error) {
	lk, err := n.locker.Lock(ctx, advisory.Name(key))
	if err != nil {
		return nil, err
	}
	return releaseFunc(lk.Unlock), nil
}

func (n *pgbatonNode) close(ctx context.Context) error {
	err := n.locker.Close(ctx)
	n.pool.Close()
	return err
}

// --- raw pgx: a dedicated connection per goroutine, plain SQL.

type rawNode struct {
	e  *env
	mu sync.Mutex
	ws []*rawWorker
}

type rawWorker struct{ c *pgx.Conn }

func (e *env) newRawNode(context.Context) (lockNode, error) { return &rawNode{e: e}, nil }

func (n *rawNode) worker(ctx context.Context) (lockWorker, error) {
	c, err := n.e.conn(ctx, "bench-raw")
	if err != nil {
		return nil, err
	}
	w := &rawWorker{c: c}
	n.mu.Lock()
	n.ws = append(n.ws, w)
	n.mu.Unlock()
	return w, nil
}

func (n *rawNode) conns(ctx context.Context) (float64, error) {
	return n.e.serverConns(ctx, "bench-raw")
}

func (n *rawNode) close(ctx context.Context) error {
	for _, w := range n.ws {
		_ = w.close(ctx)
	}
	return nil
}

func (w *rawWorker) try(ctx context.Context, key string) (held, error) {
	k := keyOf(key)
	var ok bool
	if err := w.c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", k).Scan(&ok); err != nil || !ok {
		return nil, err
	}
	return w.unlocker(k), nil
}

func (w *rawWorker) lock(ctx context.Context, key string) (held, error) {
	k := keyOf(key)
	if _, err := w.c.Exec(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
		return nil, err
	}
	return w.unlocker(k), nil
}

func (w *rawWorker) unlocker(k int64) held {
	return releaseFunc(func(ctx context.Context) error {
		var ok bool
		if err := w.c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", k).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("raw pgx: unlock of a lock not held")
		}
		return nil
	})
}

func (w *rawWorker) close(ctx context.Context) error { return w.c.Close(ctx) }

// --- go-pglock: a database/sql pool; each lock pins a connection of its own
// (pglock.NewLock) for as long as the lock object lives. Workers keep their
// lock objects, so the connection is taken from the pool once per key, not
// per operation (the cheapest way to use it).

type pglockNode struct {
	e  *env
	db *sql.DB
	mu sync.Mutex
	ws []*pglockWorker
}

type pglockWorker struct {
	n     *pglockNode
	locks map[string]*pglock.Lock
}

func (e *env) newPglockNode(context.Context) (lockNode, error) {
	db, err := e.sqlDB("bench-pglock")
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(2000)
	return &pglockNode{e: e, db: db}, nil
}

func (n *pglockNode) worker(context.Context) (lockWorker, error) {
	w := &pglockWorker{n: n, locks: map[string]*pglock.Lock{}}
	n.mu.Lock()
	n.ws = append(n.ws, w)
	n.mu.Unlock()
	return w, nil
}

func (n *pglockNode) conns(ctx context.Context) (float64, error) {
	return n.e.serverConns(ctx, "bench-pglock")
}

func (n *pglockNode) close(context.Context) error {
	for _, w := range n.ws {
		_ = w.close(context.Background())
	}
	return n.db.Close()
}

func (w *pglockWorker) get(ctx context.Context, key string) (*pglock.Lock, error) {
	if l, ok := w.locks[key]; ok {
		return l, nil
	}
	l, err := pglock.NewLock(ctx, keyOf(key), w.n.db)
	if err != nil {
		return nil, err
	}
	w.locks[key] = &l
	return &l, nil
}

func (w *pglockWorker) try(ctx context.Context, key string) (held, error) {
	l, err := w.get(ctx, key)
	if err != nil {
		return nil, err
	}
	ok, err := l.Lock(ctx)
	if err != nil || !ok {
		return nil, err
	}
	return releaseFunc(l.Unlock), nil
}

func (w *pglockWorker) lock(ctx context.Context, key string) (held, error) {
	l, err := w.get(ctx, key)
	if err != nil {
		return nil, err
	}
	if err := l.WaitAndLock(ctx); err != nil {
		return nil, err
	}
	return releaseFunc(l.Unlock), nil
}

func (w *pglockWorker) close(context.Context) error {
	for k, l := range w.locks {
		_ = l.Close()
		delete(w.locks, k)
	}
	return nil
}

// --- redislock: SET NX PX to obtain, a Lua script to release. Waiting
// polls every millisecond (redislock has no wake-up).

const redisTTL = 30 * time.Second

type redisNode struct {
	c   *redis.Client
	rl  *redislock.Client
	ttl time.Duration
}

func (e *env) newRedisNode(context.Context) (lockNode, error) {
	c := e.redisClient()
	return &redisNode{c: c, rl: redislock.New(c), ttl: redisTTL}, nil
}

func (n *redisNode) worker(context.Context) (lockWorker, error) { return n, nil }
func (n *redisNode) conns(context.Context) (float64, error) {
	return float64(n.c.PoolStats().TotalConns), nil
}
func (n *redisNode) close(context.Context) error { return n.c.Close() }

func (n *redisNode) try(ctx context.Context, key string) (held, error) {
	l, err := n.rl.Obtain(ctx, key, n.ttl, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return releaseFunc(l.Release), nil
}

func (n *redisNode) lock(ctx context.Context, key string) (held, error) {
	// Without a deadline redislock gives up after one TTL; wait as long as
	// the others do.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := n.rl.Obtain(ctx, key, n.ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return releaseFunc(l.Release), nil
}

// --- scenarios

// uncontendedScenario: clients goroutines of one process, each on its own
// key, take and release it as fast as they can.
func (e *env) uncontendedScenario(clients int) *scenario {
	sc := e.cycleScenario(clients, e.advisoryBackends())
	sc.title = fmt.Sprintf("Advisory lock: uncontended try + release, %d client(s)", clients)
	sc.note = "One process; every client (goroutine) takes and releases its own key in a loop. " +
		"pgbaton shares one Locker (multiplexed sessions: a second opens under load, Config.MaxSessionsUnderLoad 2); raw pgx and go-pglock pin a connection per client; " +
		"redislock shares one go-redis client. Connections: held for locks during the run (pgbaton's idle pool " +
		"connections, which serve the application's other queries, not counted; for Redis the client's pool)."
	return sc
}

// cycleScenario: clients goroutines of one process loop try + release,
// each on its own key.
func (e *env) cycleScenario(clients int, backends []*lockBackend) *scenario {
	sc := &scenario{metrics: []metric{{name: "ops/s", higherBetter: true}, {name: "connections"}}}
	for _, b := range backends {
		var node lockNode
		var workers []lockWorker
		im := &impl{name: b.name, skip: b.skip}
		im.setup = func(ctx context.Context) error {
			var err error
			if node, err = b.newNode(ctx); err != nil {
				return err
			}
			for range clients {
				w, err := node.worker(ctx)
				if err != nil {
					return err
				}
				workers = append(workers, w)
			}
			return nil
		}
		im.teardown = func(ctx context.Context) error { return node.close(ctx) }
		im.run = func(ctx context.Context) (sample, error) {
			var ops atomic.Int64
			deadline := time.Now().Add(e.window)
			start := time.Now()
			err := parallel(clients, func(i int) error {
				key := fmt.Sprintf("bench:u:%d", i)
				for time.Now().Before(deadline) {
					h, err := workers[i].try(ctx, key)
					if err != nil {
						return err
					}
					if h == nil {
						return fmt.Errorf("%s: uncontended key %s was held", b.name, key)
					}
					if err := h.release(ctx); err != nil {
						return err
					}
					ops.Add(1)
				}
				return nil
			})
			elapsed := time.Since(start)
			if err != nil {
				return nil, err
			}
			conns, err := node.conns(ctx)
			if err != nil {
				return nil, err
			}
			return sample{"ops/s": float64(ops.Load()) / elapsed.Seconds(), "connections": conns}, nil
		}
		sc.impls = append(sc.impls, im)
	}
	return sc
}

// contendedScenario: clients processes (one node each) wait for the same
// key, hold it for no time and release it.
func (e *env) contendedScenario(clients int) *scenario {
	sc := &scenario{
		title: fmt.Sprintf("Advisory lock: contended, %d clients on one key", clients),
		note: "Each client stands for its own process (its own Locker, connection or Redis client) and loops " +
			"blocking lock + release on one key. Fairness is the most acquisitions of a client ÷ the fewest (1 is fair). " +
			"redislock waits by polling every 1 ms.",
		metrics: []metric{{name: "acquisitions/s", higherBetter: true}, {name: "fairness max/min", format: "%.2f"},
			{name: "new connections/acquisition", format: "%.2f"}},
	}
	for _, b := range e.advisoryBackends() {
		var nodes []lockNode
		var workers []lockWorker
		im := &impl{name: b.name, skip: b.skip}
		im.setup = func(ctx context.Context) error {
			for range clients {
				n, err := b.newNode(ctx)
				if err != nil {
					return err
				}
				nodes = append(nodes, n)
				w, err := n.worker(ctx)
				if err != nil {
					return err
				}
				workers = append(workers, w)
			}
			return nil
		}
		im.teardown = func(ctx context.Context) error {
			for _, n := range nodes {
				_ = n.close(ctx)
			}
			return nil
		}
		im.run = func(ctx context.Context) (sample, error) {
			sessions0, err := e.sessionsOpened(ctx)
			if err != nil {
				return nil, err
			}
			counts := make([]int64, clients)
			deadline := time.Now().Add(e.window)
			start := time.Now()
			// Nobody is cancelled at the deadline (a cancelled raw pgx query
			// closes its connection): each client stops after its next
			// release, so every waiter is eventually served.
			err = parallel(clients, func(i int) error {
				for {
					h, err := workers[i].lock(ctx, "bench:contended")
					if err != nil {
						return err
					}
					late := !time.Now().Before(deadline)
					if !late {
						counts[i]++
					}
					if err := h.release(ctx); err != nil {
						return err
					}
					if late {
						return nil
					}
				}
			})
			if err != nil {
				return nil, err
			}
			total, lo, hi := int64(0), counts[0], counts[0]
			for _, c := range counts {
				total += c
				lo, hi = min(lo, c), max(hi, c)
			}
			fair := float64(hi) / float64(max(lo, 1))
			sessions1, err := e.sessionsOpened(ctx)
			if err != nil {
				return nil, err
			}
			smp := sample{"acquisitions/s": float64(total) / deadline.Sub(start).Seconds(), "fairness max/min": fair}
			if b.app != "" {
				// Minus the monitor connections sessionsOpened made itself.
				smp["new connections/acquisition"] = float64(sessions1-sessions0-2) / float64(max(total, 1))
			}
			return smp, nil
		}
		sc.impls = append(sc.impls, im)
	}
	return sc
}

// waitingOnServer polls pg_locks until an advisory lock request waits.
func waitingOnServer(ctx context.Context, mon *pgx.Conn) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := mon.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("waiter never showed up in pg_locks")
		}
	}
}

// handoverScenario: the holder releases while another process waits; the
// latency is from the start of the release to the waiter holding the lock.
// With kill, the holder is a child process that is SIGKILLed instead.
func (e *env) handoverScenario(kill bool) *scenario {
	if !kill {
		return e.handoverScenarioFor(e.advisoryBackends(), nil, 0)
	}
	b := e.advisoryBackends()[:3]
	sc := e.handoverScenarioFor(b, map[string]string{b[0].name: "adv-pgbaton", b[1].name: "adv-raw", b[2].name: "adv-pglock"}, e.killRuns)
	sc.title = "Advisory lock: handover latency after SIGKILL of the holder"
	sc.note = "The holder is a child process that takes the lock and is then SIGKILLed while the waiter (this process) " +
		"is blocked; latency: the kill → the waiter holds the lock. The server frees a session lock as soon as it " +
		"sees the connection close. (Lease and Redis locks wait for their TTL instead: see the lease tables.)"
	return sc
}

// waitSignaler is a worker that can tell when its lock call is blocked.
type waitSignaler interface{ waitSignal() <-chan struct{} }

// handoverScenarioFor measures handover between two nodes of each backend.
// With killModes, the holder is a child process (-child mode) that is
// SIGKILLed instead of releasing, killSamples times per run.
func (e *env) handoverScenarioFor(backends []*lockBackend, killModes map[string]string, killSamples int) *scenario {
	kill := killModes != nil
	sc := &scenario{
		title: "Advisory lock: handover latency on release",
		note: "Two processes (nodes); the waiter is blocked in lock (seen waiting in pg_locks; for Redis, polling) " +
			"when the holder releases. Latency: start of the release → the waiter holds the lock.",
		metrics: []metric{{name: "p50 ms", format: "%.3f"}, {name: "p99 ms", format: "%.3f"}},
	}
	for _, b := range backends {
		var nodes [2]lockNode
		var workers [2]lockWorker
		var mon *pgx.Conn
		im := &impl{name: b.name, skip: b.skip}
		im.setup = func(ctx context.Context) error {
			for i := range nodes {
				n, err := b.newNode(ctx)
				if err != nil {
					return err
				}
				nodes[i] = n
				if workers[i], err = n.worker(ctx); err != nil {
					return err
				}
			}
			var err error
			mon, err = e.conn(ctx, "bench-monitor")
			return err
		}
		im.teardown = func(ctx context.Context) error {
			for _, n := range nodes {
				_ = n.close(ctx)
			}
			return mon.Close(ctx)
		}
		im.run = func(ctx context.Context) (sample, error) {
			var lat []time.Duration
			n := e.samples
			if kill {
				n = killSamples
			}
			for s := range n {
				key := fmt.Sprintf("bench:handover:%d", s%4)
				var holder held
				var ch *child
				var err error
				if kill {
					ch, err = e.startChild(ctx, killModes[b.name], key)
				} else {
					holder, err = workers[0].lock(ctx, key)
				}
				if err != nil {
					return nil, err
				}
				type got struct {
					h   held
					at  time.Time
					err error
				}
				done := make(chan got, 1)
				go func() {
					h, err := workers[1].lock(ctx, key)
					done <- got{h, time.Now(), err}
				}()
				if ws, ok := workers[1].(waitSignaler); ok {
					select {
					case <-ws.waitSignal():
					case g := <-done:
						return nil, fmt.Errorf("waiter returned while the lock was held: %v", g.err)
					}
				} else if b.app == "" {
					time.Sleep(5 * time.Millisecond) // a polling waiter cannot be observed; let it poll
				} else if err := waitingOnServer(ctx, mon); err != nil {
					return nil, err
				}
				t0 := time.Now()
				if kill {
					ch.kill()
				} else if err := holder.release(ctx); err != nil {
					return nil, err
				}
				g := <-done
				if g.err != nil {
					return nil, g.err
				}
				lat = append(lat, g.at.Sub(t0))
				if err := g.h.release(ctx); err != nil {
					return nil, err
				}
			}
			p50, p99 := percentiles(lat)
			return sample{"p50 ms": p50, "p99 ms": p99}, nil
		}
		sc.impls = append(sc.impls, im)
	}
	return sc
}

// holdScenario: one process takes n different locks and keeps them; how
// many server connections does it use, and how much client heap per lock?
func (e *env) holdScenario(n int, extra ...*lockBackend) *scenario {
	sc := &scenario{
		title: fmt.Sprintf("Holding %d lock(s) in one process: connections and client memory", n),
		note: "Connections: open to the server while the locks are held (for Redis, the client pool's). " +
			"Heap: Go heap in use after GC, with the locks held minus before, ÷ locks.",
		metrics: []metric{{name: "connections"}, {name: "heap bytes/lock"}},
	}
	for _, b := range append(e.advisoryBackends(), extra...) {
		im := &impl{name: b.name, skip: b.skip}
		im.run = func(ctx context.Context) (sample, error) {
			node, err := b.newNode(ctx)
			if err != nil {
				return nil, err
			}
			defer node.close(ctx)
			w, err := node.worker(ctx) // closed with the node
			if err != nil {
				return nil, err
			}
			before := heapInUse()
			hs := make([]held, 0, n)
			for i := range n {
				h, err := w.try(ctx, fmt.Sprintf("bench:hold:%d", i))
				if err != nil {
					return nil, err
				}
				if h == nil {
					return nil, fmt.Errorf("bench:hold:%d was held", i)
				}
				hs = append(hs, h)
			}
			after := heapInUse()
			conns, err := node.conns(ctx)
			if err != nil {
				return nil, err
			}
			for _, h := range hs {
				if err := h.release(ctx); err != nil {
					return nil, err
				}
			}
			return sample{"connections": conns, "heap bytes/lock": float64(after-before) / float64(n)}, nil
		}
		sc.impls = append(sc.impls, im)
	}
	return sc
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// parallel runs fn(0..n-1) in goroutines and returns the first error.
func parallel(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
