package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/vgarvardt/gue/v5"
	"github.com/vgarvardt/gue/v5/adapter/pgxv5"

	"github.com/pgbaton/pgbaton/leasetable"
)

// claimWorkers is how many goroutines claim concurrently in every
// implementation (River: MaxWorkers = claimWorkers × batch).
const claimWorkers = 4

// newRef is a request id for a claim: random bytes, which pgx sends as a
// uuid.
func newRef() (ref [16]byte) {
	_, _ = rand.Read(ref[:])
	return ref
}

// deepCap bounds a run on the deep queue.
const deepCap = 20 * time.Second

// gueSchema is gue v5's table (its migrations/schema.sql).
const gueSchema = `
CREATE TABLE IF NOT EXISTS gue_jobs (
  job_id TEXT NOT NULL PRIMARY KEY, priority SMALLINT NOT NULL, run_at TIMESTAMPTZ NOT NULL,
  job_type TEXT NOT NULL, args BYTEA NOT NULL, error_count INTEGER NOT NULL DEFAULT 0,
  last_error TEXT, queue TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL);
CREATE INDEX IF NOT EXISTS idx_gue_jobs_selector ON gue_jobs (queue, run_at, priority)`

func (e *env) claimScenarios() []*scenario {
	var s []*scenario
	for _, batch := range []int{1, 10, 100} {
		s = append(s, e.claimScenario(batch, 0, nil))
	}
	if e.backlog > 0 {
		deep := &backlogs{}
		for _, batch := range []int{1, 10, 100} {
			s = append(s, e.claimScenario(batch, e.backlog, deep))
		}
	}
	return s
}

// backlogs fills each implementation's deep queue once; the three batch
// sizes then drain from it (every run adds what it takes).
type backlogs struct {
	pgbaton, raw, river, gue onceErr
}

type onceErr struct {
	once sync.Once
	err  error
}

func (o *onceErr) do(fn func() error) error {
	o.once.Do(func() { o.err = fn() })
	return o.err
}

// inChunks calls fn with consecutive ranges [from, to) covering n.
func inChunks(n, size int, fn func(from, to int) error) error {
	for from := 0; from < n; from += size {
		if err := fn(from, min(from+size, n)); err != nil {
			return err
		}
	}
	return nil
}

// claimScenario drains work items with claimWorkers workers, batch at a
// time. With backlog 0 every run inserts e.rows items and drains them all;
// otherwise the queue holds backlog items (filled once, shared by the
// batch sizes through deep) and every run adds e.rows items and times the
// completion of e.rows of them, whichever the implementation takes.
func (e *env) claimScenario(batch, backlog int, deep *backlogs) *scenario {
	sc := &scenario{
		title: fmt.Sprintf("Work items: claim + complete, batch %d, %d rows", batch, e.rows),
		note: fmt.Sprintf("Every run starts on a clean table (not timed: VACUUM after the previous run's rows are "+
			"gone; River's is truncated), then %d rows are inserted (not timed) and %d workers drain them; items/s = rows ÷ time until "+
			"the last is completed. ", e.rows, claimWorkers),
		metrics:  []metric{{name: "items/s", higherBetter: true}},
		noWarmup: true, // every run inserts its own rows
	}
	if backlog > 0 {
		sc.title = fmt.Sprintf("Work items: claim + complete, batch %d, %d of %d queued rows", batch, e.rows, backlog+e.rows)
		sc.note = fmt.Sprintf("The queue holds a backlog of %d rows (inserted once, not timed, shared by the three batch sizes). "+
			"Every run adds %d rows (not timed), then %d workers complete %d items, whichever they get, or stop after %s; "+
			"items/s = items completed ÷ time taken. ", backlog, e.rows, claimWorkers, e.rows, deepCap)
	}
	sc.note += fmt.Sprintf("pgbaton: Register, Claim(group, %d), then CompleteAndClaim: the finished batch and the next claim in one "+
		"round trip and one commit; calls of the 4 workers that arrive while two are on the wire go together in the next, up to "+
		"100 leases claimed. raw pgx: the SQL pgbaton sends, with the same arguments, as one pipelined batch: pgbaton.complete_many "+
		"and pgbaton.claim bound to a lease session and a request id. River: a client with "+
		"MaxWorkers %d and a no-op worker, FetchCooldown 1 ms, FetchPollInterval 10 ms; ends at the %d-th "+
		"JobCompleted event. gue: a WorkerPool of %d (one job per transaction, batch does not apply), "+
		"poll interval 1 ms.", batch, claimWorkers*batch, e.rows, claimWorkers)
	if deep == nil {
		deep = &backlogs{}
	}
	// Lease names are global: each group and run gets its own.
	var runNo atomic.Int64
	itemNames := func(group string, from, to int, tag string) []string {
		names := make([]string, 0, to-from)
		for i := from; i < to; i++ {
			names = append(names, fmt.Sprintf("%s/%s%07d", group, tag, i))
		}
		return names
	}
	runNames := func(group string) []string {
		return itemNames(group, 0, e.rows, fmt.Sprintf("r%d-", runNo.Add(1)))
	}
	// until is when a run stops short of e.rows items: never for the
	// 10k drains, which must finish, deepCap for the deep queue, where
	// gue's claim query takes most of a second at 1M rows.
	until := func(start time.Time) time.Time {
		if backlog == 0 {
			return start.Add(5 * time.Minute)
		}
		return start.Add(deepCap)
	}
	const chunk = 50000
	var pool *pgxpool.Pool
	setupPool := func(ctx context.Context) (err error) {
		if pool == nil {
			pool, err = e.pool(ctx, "bench-claim", claimWorkers*2+4)
		}
		return err
	}
	// clean vacuums table before a 10k run (not timed), so that every
	// implementation starts on a table without the dead rows of earlier
	// runs, as River's, truncated, does; the deep queue is left as it
	// grows, for everyone.
	clean := func(ctx context.Context, table string) error {
		if backlog > 0 {
			return nil
		}
		_, err := pool.Exec(ctx, "VACUUM "+table)
		return err
	}

	// pgbaton
	{
		var c *leasetable.Client
		group := fmt.Sprintf("bench-claim-%d", batch)
		if backlog > 0 {
			group = "bench-claim-deep"
		}
		im := &impl{name: "pgbaton leasetable Claim"}
		im.setup = func(ctx context.Context) (err error) {
			if err = setupPool(ctx); err != nil {
				return err
			}
			if c, err = leasetable.New(ctx, pool, leasetable.Config{}); err != nil {
				return err
			}
			return deep.pgbaton.do(func() error {
				return inChunks(backlog, chunk, func(from, to int) error {
					_, err := c.Register(ctx, group, itemNames(group, from, to, "b")...)
					return err
				})
			})
		}
		im.teardown = func(ctx context.Context) error { return c.Close(ctx) }
		im.run = func(ctx context.Context) (sample, error) {
			if err := clean(ctx, "pgbaton.lease"); err != nil {
				return nil, err
			}
			if _, err := c.Register(ctx, group, runNames(group)...); err != nil {
				return nil, err
			}
			var done atomic.Int64
			start := time.Now()
			stopAt := until(start)
			err := parallel(claimWorkers, func(int) error {
				ls, err := c.Claim(ctx, group, batch)
				for err == nil && len(ls) > 0 {
					if done.Add(int64(len(ls))) >= int64(e.rows) || !time.Now().Before(stopAt) {
						return c.Complete(ctx, ls...)
					}
					// The finished batch and the next claim: one round
					// trip and one commit, as the raw variant's batch.
					ls, err = c.CompleteAndClaim(ctx, group, batch, ls...)
				}
				return err
			})
			return e.drained(start, done.Load(), backlog > 0, err)
		}
		sc.impls = append(sc.impls, im)
	}

	// raw pgx: the same SQL functions.
	{
		group := fmt.Sprintf("bench-claim-raw-%d", batch)
		if backlog > 0 {
			group = "bench-claim-raw-deep"
		}
		register := func(ctx context.Context, names []string) error {
			_, err := pool.Exec(ctx, "SELECT pgbaton.register($1, $2)", group, names)
			return err
		}
		im := &impl{name: "raw pgx (same SQL functions)"}
		im.setup = func(ctx context.Context) error {
			if err := setupPool(ctx); err != nil {
				return err
			}
			return deep.raw.do(func() error {
				return inChunks(backlog, chunk, func(from, to int) error {
					return register(ctx, itemNames(group, from, to, "b"))
				})
			})
		}
		im.run = func(ctx context.Context) (sample, error) {
			if err := clean(ctx, "pgbaton.lease"); err != nil {
				return nil, err
			}
			if err := register(ctx, runNames(group)); err != nil {
				return nil, err
			}
			var done atomic.Int64
			start := time.Now()
			stopAt := until(start)
			err := parallel(claimWorkers, func(w int) error {
				owner := fmt.Sprintf("bench-raw-claimer-%d", w)
				return pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
					// What pgbaton's client sends: its claims bound to a
					// lease session (here one per worker for
					// the run, closed at its end) and to a request id, so
					// that a claim is safe to retry and to give back;
					// completions as one complete_many.
					var session int64
					if err := c.QueryRow(ctx, "SELECT id FROM pgbaton.session_open($1, $2)", owner, 600000).Scan(&session); err != nil {
						return err
					}
					defer func() { _, _ = c.Exec(context.WithoutCancel(ctx), "SELECT pgbaton.session_close($1)", session) }()
					const claimSQL = "SELECT name, token FROM pgbaton.claim($1, $2, $3, $4, $5, $6, false)"
					type claimed struct {
						names  []string
						tokens []int64
					}
					scan := func(rows pgx.Rows) (cl claimed, err error) {
						var name string
						var token int64
						_, err = pgx.ForEachRow(rows, []any{&name, &token}, func() error {
							cl.names, cl.tokens = append(cl.names, name), append(cl.tokens, token)
							return nil
						})
						return cl, err
					}
					rows, _ := c.Query(ctx, claimSQL, group, owner, batch, 30000, session, newRef())
					items, err := scan(rows)
					for err == nil && len(items.names) > 0 {
						last := done.Add(int64(len(items.names))) >= int64(e.rows) || !time.Now().Before(stopAt)
						// The finished items and the next claim in one
						// pipelined batch: one round trip, one commit.
						b := &pgx.Batch{}
						b.Queue("SELECT name FROM pgbaton.complete_many($1, $2, $3) AS name", items.names, items.tokens, owner)
						var next claimed
						if !last {
							b.Queue(claimSQL, group, owner, batch, 30000, session, newRef()).Query(func(rows pgx.Rows) (err error) {
								next, err = scan(rows)
								return err
							})
						}
						if err = c.SendBatch(ctx, b).Close(); last {
							return err
						}
						items = next
					}
					return err
				})
			})
			return e.drained(start, done.Load(), backlog > 0, err)
		}
		sc.impls = append(sc.impls, im)
	}

	// River
	{
		noops := func(n int) []river.InsertManyParams {
			params := make([]river.InsertManyParams, n)
			for i := range params {
				params[i] = river.InsertManyParams{Args: noopArgs{}}
			}
			return params
		}
		im := &impl{name: "River (riverpgxv5)"}
		im.setup = func(ctx context.Context) error {
			if err := setupPool(ctx); err != nil {
				return err
			}
			m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
			if err != nil {
				return err
			}
			if _, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
				return err
			}
			return deep.river.do(func() error {
				if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
					return err
				}
				inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
				if err != nil {
					return err
				}
				return inChunks(backlog, chunk, func(from, to int) error {
					_, err := inserter.InsertManyFast(ctx, noops(to-from))
					return err
				})
			})
		}
		im.run = func(ctx context.Context) (sample, error) {
			if backlog == 0 {
				if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
					return nil, err
				}
			}
			workers := river.NewWorkers()
			river.AddWorker(workers, &noopWorker{})
			client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
				Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: claimWorkers * batch}},
				Workers:           workers,
				FetchCooldown:     time.Millisecond,
				FetchPollInterval: 10 * time.Millisecond,
			})
			if err != nil {
				return nil, err
			}
			if _, err := client.InsertManyFast(ctx, noops(e.rows)); err != nil {
				return nil, err
			}
			events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: e.rows + claimWorkers*batch + 100,
				Kinds: []river.EventKind{river.EventKindJobCompleted}})
			defer cancel()
			start := time.Now()
			if err := client.Start(ctx); err != nil {
				return nil, err
			}
			timeout := time.NewTimer(time.Until(until(start)))
			defer timeout.Stop()
			n := 0
		wait:
			for n < e.rows {
				select {
				case <-events:
					n++
				case <-timeout.C:
					break wait
				}
			}
			el := time.Since(start)
			if err := client.Stop(ctx); err != nil {
				return nil, err
			}
			return e.rate(int64(n), el, backlog > 0, nil)
		}
		sc.impls = append(sc.impls, im)
	}

	// gue
	{
		var gc *gue.Client
		enqueue := func(ctx context.Context, n int) error {
			return inChunks(n, 5000, func(from, to int) error { // one INSERT is limited to 65535 parameters
				jobs := make([]*gue.Job, to-from)
				for i := range jobs {
					jobs[i] = &gue.Job{Type: "noop", Queue: "bench"}
				}
				return gc.EnqueueBatch(ctx, jobs)
			})
		}
		im := &impl{name: "gue v5 (pgxv5)"}
		im.setup = func(ctx context.Context) (err error) {
			if err = setupPool(ctx); err != nil {
				return err
			}
			if _, err = pool.Exec(ctx, gueSchema); err != nil {
				return err
			}
			if gc, err = gue.NewClient(pgxv5.NewConnPool(pool)); err != nil {
				return err
			}
			return deep.gue.do(func() error {
				if _, err := pool.Exec(ctx, "DELETE FROM gue_jobs"); err != nil {
					return err
				}
				return enqueue(ctx, backlog)
			})
		}
		im.run = func(ctx context.Context) (sample, error) {
			if backlog == 0 {
				if _, err := pool.Exec(ctx, "DELETE FROM gue_jobs"); err != nil {
					return nil, err
				}
				if err := clean(ctx, "gue_jobs"); err != nil {
					return nil, err
				}
			}
			if err := enqueue(ctx, e.rows); err != nil {
				return nil, err
			}
			var done atomic.Int64
			all := make(chan struct{})
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			wp, err := gue.NewWorkerPool(gc, gue.WorkMap{"noop": func(context.Context, *gue.Job) error { return nil }}, claimWorkers,
				gue.WithPoolQueue("bench"), gue.WithPoolPollInterval(time.Millisecond),
				gue.WithPoolHooksJobDone(func(_ context.Context, _ *gue.Job, err error) {
					if err == nil && done.Add(1) == int64(e.rows) {
						close(all)
					}
				}))
			if err != nil {
				return nil, err
			}
			start := time.Now()
			ran := make(chan error, 1)
			go func() { ran <- wp.Run(runCtx) }()
			timeout := time.NewTimer(time.Until(until(start)))
			defer timeout.Stop()
			select {
			case <-all:
			case err := <-ran:
				return nil, fmt.Errorf("gue pool stopped: %v", err)
			case <-timeout.C:
			}
			stop() // the last job's delete commits before Run returns
			if err := <-ran; err != nil {
				return nil, err
			}
			return e.drained(start, min(done.Load(), int64(e.rows)), backlog > 0, nil)
		}
		sc.impls = append(sc.impls, im)
	}
	lastTeardown := sc.impls[len(sc.impls)-1]
	lastTeardown.teardown = func(context.Context) error {
		if pool != nil {
			pool.Close()
		}
		return nil
	}
	return sc
}

// drained is the sample of a run that started at start and completed n
// items.
func (e *env) drained(start time.Time, n int64, mayStopShort bool, err error) (sample, error) {
	return e.rate(n, time.Since(start), mayStopShort, err)
}

// rate is the sample of a run that completed n items in el: e.rows or
// more, unless the run may stop short (the deep queue), where any
// progress is a figure.
func (e *env) rate(n int64, el time.Duration, mayStopShort bool, err error) (sample, error) {
	if err == nil && (n < int64(e.rows) && !mayStopShort || n == 0) {
		err = fmt.Errorf("completed %d of %d", n, e.rows)
	}
	return sample{"items/s": float64(n) / el.Seconds()}, err
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (*noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }
