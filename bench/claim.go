package main

import (
	"context"
	"errors"
	"fmt"
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
		s = append(s, e.claimScenario(batch))
	}
	return s
}

func (e *env) claimScenario(batch int) *scenario {
	sc := &scenario{
		title: fmt.Sprintf("Work items: claim + complete, batch %d, %d rows", batch, e.rows),
		note: fmt.Sprintf("%d rows are inserted (not timed), then %d workers drain them; items/s = rows ÷ time until "+
			"the last is completed. pgbaton: Register, then Claim(group, %d) and Client.Complete of the batch (one round trip). raw pgx: "+
			"pgbaton.claim and one pipelined batch of pgbaton.complete per claim. River: %d jobs inserted, a client with "+
			"MaxWorkers %d and a no-op worker, FetchCooldown 1 ms, FetchPollInterval 10 ms; ends at the last "+
			"JobCompleted event. gue: a WorkerPool of %d (one job per transaction, batch does not apply), "+
			"poll interval 1 ms.", e.rows, claimWorkers, batch, e.rows, claimWorkers*batch, claimWorkers),
		metrics:  []metric{{name: "items/s", higherBetter: true}},
		noWarmup: true, // every run inserts its own rows
	}
	// Lease names are global: each group gets its own.
	itemNames := func(group string) []string {
		names := make([]string, e.rows)
		for i := range names {
			names[i] = fmt.Sprintf("%s/%07d", group, i)
		}
		return names
	}
	var pool *pgxpool.Pool
	setupPool := func(ctx context.Context) (err error) {
		if pool == nil {
			pool, err = e.pool(ctx, "bench-claim", claimWorkers*2+4)
		}
		return err
	}

	// pgbaton
	{
		var c *leasetable.Client
		group := fmt.Sprintf("bench-claim-%d", batch)
		im := &impl{name: "pgbaton leasetable Claim"}
		im.setup = func(ctx context.Context) (err error) {
			if err = setupPool(ctx); err != nil {
				return err
			}
			c, err = leasetable.New(ctx, pool, leasetable.Config{})
			return err
		}
		im.teardown = func(ctx context.Context) error { return c.Close(ctx) }
		im.run = func(ctx context.Context) (sample, error) {
			if _, err := c.Register(ctx, group, itemNames(group)...); err != nil {
				return nil, err
			}
			var done atomic.Int64
			start := time.Now()
			err := parallel(claimWorkers, func(int) error {
				for {
					ls, err := c.Claim(ctx, group, batch)
					if err != nil || len(ls) == 0 {
						return err
					}
					// One round trip and one commit for the batch, as the
					// raw variant's pipelined batch does.
					if err := c.Complete(ctx, ls...); err != nil {
						return err
					}
					done.Add(int64(len(ls)))
				}
			})
			return e.drained(start, done.Load(), err)
		}
		sc.impls = append(sc.impls, im)
	}

	// raw pgx: the same SQL functions.
	{
		group := fmt.Sprintf("bench-claim-raw-%d", batch)
		im := &impl{name: "raw pgx (same SQL functions)"}
		im.setup = setupPool
		im.run = func(ctx context.Context) (sample, error) {
			if _, err := pool.Exec(ctx, "SELECT pgbaton.register($1, $2)", group, itemNames(group)); err != nil {
				return nil, err
			}
			var done atomic.Int64
			start := time.Now()
			err := parallel(claimWorkers, func(w int) error {
				owner := fmt.Sprintf("bench-raw-claimer-%d", w)
				return pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
					for {
						type item struct {
							name  string
							token int64
						}
						rows, _ := c.Query(ctx, "SELECT name, token FROM pgbaton.claim($1, $2, $3, $4)", group, owner, batch, 30000)
						items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (it item, err error) {
							err = r.Scan(&it.name, &it.token)
							return it, err
						})
						if err != nil || len(items) == 0 {
							return err
						}
						b := &pgx.Batch{}
						for _, it := range items {
							b.Queue("SELECT pgbaton.complete($1, $2, $3)", it.name, owner, it.token)
						}
						if err := c.SendBatch(ctx, b).Close(); err != nil {
							return err
						}
						done.Add(int64(len(items)))
					}
				})
			})
			return e.drained(start, done.Load(), err)
		}
		sc.impls = append(sc.impls, im)
	}

	// River
	{
		im := &impl{name: "River (riverpgxv5)"}
		im.setup = func(ctx context.Context) error {
			if err := setupPool(ctx); err != nil {
				return err
			}
			m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
			if err != nil {
				return err
			}
			_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
			return err
		}
		im.run = func(ctx context.Context) (sample, error) {
			if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
				return nil, err
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
			params := make([]river.InsertManyParams, e.rows)
			for i := range params {
				params[i] = river.InsertManyParams{Args: noopArgs{}}
			}
			if _, err := client.InsertManyFast(ctx, params); err != nil {
				return nil, err
			}
			events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: e.rows + 100,
				Kinds: []river.EventKind{river.EventKindJobCompleted}})
			defer cancel()
			start := time.Now()
			if err := client.Start(ctx); err != nil {
				return nil, err
			}
			timeout := time.After(5 * time.Minute)
			for n := 0; n < e.rows; n++ {
				select {
				case <-events:
				case <-timeout:
					_ = client.Stop(ctx)
					return nil, fmt.Errorf("river: %d of %d completed in 5 minutes", n, e.rows)
				}
			}
			el := time.Since(start)
			if err := client.Stop(ctx); err != nil {
				return nil, err
			}
			return sample{"items/s": float64(e.rows) / el.Seconds()}, nil
		}
		sc.impls = append(sc.impls, im)
	}

	// gue
	{
		var gc *gue.Client
		im := &impl{name: "gue v5 (pgxv5)"}
		im.setup = func(ctx context.Context) (err error) {
			if err = setupPool(ctx); err != nil {
				return err
			}
			if _, err = pool.Exec(ctx, gueSchema); err != nil {
				return err
			}
			gc, err = gue.NewClient(pgxv5.NewConnPool(pool))
			return err
		}
		im.run = func(ctx context.Context) (sample, error) {
			if _, err := pool.Exec(ctx, "DELETE FROM gue_jobs"); err != nil {
				return nil, err
			}
			jobs := make([]*gue.Job, e.rows)
			for i := range jobs {
				jobs[i] = &gue.Job{Type: "noop", Queue: "bench"}
			}
			for i := 0; i < len(jobs); i += 5000 { // one INSERT is limited to 65535 parameters
				if err := gc.EnqueueBatch(ctx, jobs[i:min(i+5000, len(jobs))]); err != nil {
					return nil, err
				}
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
			select {
			case <-all:
			case err := <-ran:
				return nil, fmt.Errorf("gue pool stopped: %v", err)
			case <-time.After(5 * time.Minute):
				return nil, errors.New("gue: not done in 5 minutes")
			}
			stop() // the last job's delete commits before Run returns
			if err := <-ran; err != nil {
				return nil, err
			}
			el := time.Since(start)
			return sample{"items/s": float64(e.rows) / el.Seconds()}, nil
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

// drained is the sample of a drain that started at start and completed n
// items.
func (e *env) drained(start time.Time, n int64, err error) (sample, error) {
	el := time.Since(start)
	if err == nil && n != int64(e.rows) {
		err = fmt.Errorf("completed %d of %d", n, e.rows)
	}
	return sample{"items/s": float64(e.rows) / el.Seconds()}, err
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (*noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }
