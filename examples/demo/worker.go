package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/examples/demo/internal/demodb"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/retention"
)

// The demo's names, shared by the orchestrator and its workers.
const (
	demoItems  = "demo:items"
	demoLeader = "demo:leader"
	demoJob    = "demo:report"
	demoSlot   = time.Second
	demoTTL    = 2 * time.Second
)

// demoEvent is one line a worker prints on stdout for the orchestrator.
type demoEvent struct {
	Worker  int    `json:"worker"`
	Kind    string `json:"kind"` // ready, slot, leader, holding, processed, stale, error
	Item    string `json:"item,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Current int64  `json:"current,omitempty"`
	Slot    string `json:"slot,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

type demoWorker struct {
	id     int
	victim bool
	skew   time.Duration
	pool   *pgxpool.Pool
	client *leasetable.Client
	q      *demodb.Queries
	mu     sync.Mutex
	out    io.Writer
}

func (w *demoWorker) emit(ev demoEvent) {
	ev.Worker = w.id
	b, _ := json.Marshal(ev)
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(w.out, "%s\n", b)
}

// runWorker is one node of the scenario, in its own OS process: the demo
// starts it as `<this executable> worker -id N ...`.
func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	w := &demoWorker{out: stdout}
	var dsn string
	fs := flag.NewFlagSet("demo worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&dsn, "dsn", "", "connection string (default: $DATABASE_URL, else the PG* variables)")
	fs.IntVar(&w.id, "id", 0, "worker number")
	fs.BoolVar(&w.victim, "victim", false, "pause between claiming and writing, so that SIGSTOP lands mid-job")
	fs.DurationVar(&w.skew, "skew", 0, "this node's clock skew for the cron ticker")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	w.pool, w.q = pool, demodb.New()
	w.client, err = leasetable.New(ctx, pool, leasetable.Config{
		Owner: fmt.Sprintf("demo-worker-%d:%d", w.id, os.Getpid()),
		TTL:   demoTTL,
	})
	if err != nil {
		return err
	}
	defer w.client.Close(context.WithoutCancel(ctx))
	w.emit(demoEvent{Kind: "ready", Detail: w.client.Owner()})
	var wg sync.WaitGroup
	wg.Go(func() { w.cron(ctx) })
	if !w.victim {
		wg.Go(func() { w.lead(ctx) })
	}
	wg.Go(func() { w.work(ctx) })
	// Old cron slots, job runs and the like are pruned by one worker at a
	// time (the leasetable client prunes its own tables by itself).
	wg.Go(func() { _ = retention.Run(ctx, w.client, retention.Config{}) })
	wg.Wait()
	return nil
}

// cron runs the report job once per slot across all workers: each worker's
// ticker is skewed, and ClaimSlot lets exactly one of them run each slot.
func (w *demoWorker) cron(ctx context.Context) {
	tick := time.NewTicker(demoSlot / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		slot := time.Now().Add(w.skew).Truncate(demoSlot)
		won, err := jobs.ClaimSlot(ctx, w.client, demoJob, slot)
		if err != nil {
			if ctx.Err() == nil {
				w.emit(demoEvent{Kind: "error", Detail: "claim slot: " + err.Error()})
			}
			continue
		}
		if won {
			if err := w.q.DemoRecordSlotRun(ctx, w.pool, demodb.DemoRecordSlotRunParams{Job: demoJob, Slot: slot, Worker: int32(w.id)}); err != nil && ctx.Err() == nil {
				w.emit(demoEvent{Kind: "error", Detail: "record slot: " + err.Error()})
			}
			w.emit(demoEvent{Kind: "slot", Slot: slot.Format(time.TimeOnly)})
		}
	}
}

// lead campaigns for leadership until ctx ends, again after each loss.
func (w *demoWorker) lead(ctx context.Context) {
	for ctx.Err() == nil {
		ld, err := w.client.Elect(ctx, demoLeader, fmt.Sprintf("worker-%d", w.id))
		if err != nil {
			if ctx.Err() == nil {
				w.emit(demoEvent{Kind: "error", Detail: "elect: " + err.Error()})
			}
			return
		}
		if err := w.q.DemoRecordTerm(ctx, w.pool, demodb.DemoRecordTermParams{Worker: int32(w.id), Name: demoLeader, Term: ld.Term()}); err != nil && ctx.Err() == nil {
			w.emit(demoEvent{Kind: "error", Detail: "record term: " + err.Error()})
		}
		w.emit(demoEvent{Kind: "leader", Token: ld.Term()})
		select {
		case <-ctx.Done():
			_ = ld.Resign(context.WithoutCancel(ctx))
		case <-ld.Done():
		}
	}
}

// work claims items and processes each in a fenced transaction that also
// completes the item's lease, so an item is done exactly once or not at all.
func (w *demoWorker) work(ctx context.Context) {
	batch := 3
	if w.victim {
		batch = 1
	}
	for ctx.Err() == nil {
		leases, err := w.client.ClaimWait(ctx, demoItems, batch)
		if err != nil {
			if ctx.Err() == nil {
				w.emit(demoEvent{Kind: "error", Detail: "claim: " + err.Error()})
			}
			return
		}
		for _, l := range leases {
			w.process(ctx, l)
		}
	}
}

func (w *demoWorker) process(ctx context.Context, l *leasetable.Lease) {
	work := 20 * time.Millisecond
	if w.victim {
		// A slow step between deciding and writing: the orchestrator's
		// SIGSTOP lands here, the way a GC pause or a stalled VM would.
		w.emit(demoEvent{Kind: "holding", Item: l.Name(), Token: l.Token()})
		work = 400 * time.Millisecond
	}
	time.Sleep(work) // the "work"; deliberately not watching l.Done()
	err := fencedwrite.InTx(ctx, w.pool, l, func(tx pgx.Tx) error {
		if err := w.q.DemoRecordProcessed(ctx, tx, demodb.DemoRecordProcessedParams{Worker: int32(w.id), Item: l.Name()}); err != nil {
			return err
		}
		done, err := w.q.DemoComplete(ctx, tx, demodb.DemoCompleteParams{Name: l.Name(), Owner: w.client.Owner(), Token: l.Token()})
		if err == nil && !done {
			err = fmt.Errorf("complete %s: not held", l.Name())
		}
		return err
	})
	var stale *fencedwrite.StaleTokenError
	switch {
	case errors.As(err, &stale):
		w.emit(demoEvent{Kind: "stale", Item: l.Name(), Token: stale.Presented, Current: stale.Current, Detail: string(stale.Reason)})
	case err != nil:
		if ctx.Err() == nil {
			w.emit(demoEvent{Kind: "error", Item: l.Name(), Detail: err.Error()})
		}
	default:
		w.emit(demoEvent{Kind: "processed", Item: l.Name(), Token: l.Token()})
	}
	// The row is gone (completed) or someone else's: stop keeping it alive.
	_ = l.Release(context.WithoutCancel(ctx))
}
