package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/leasetable"
)

// claimWaitPoll is the NoListen worker's PollInterval: the client's
// default.
const claimWaitPoll = time.Second

// claimWaitScenario: an idle worker waits in ClaimWait on an empty queue
// while a producer (another client) registers one item; the latency is
// from the start of Register to ClaimWait returning the item.
func (e *env) claimWaitScenario() *scenario {
	sc := &scenario{
		title: "Work items: wake-up of an idle worker waiting in ClaimWait",
		note: fmt.Sprintf("One worker client waits in ClaimWait(group, 1) on an empty queue (seen waiting by its debug log); "+
			"a producer client registers one item. Latency: start of Register → ClaimWait returns the item (which is then "+
			"completed, not timed). LISTEN: woken by the NOTIFY Register sends to the group's waiters. NoListen: the worker "+
			"looks again every PollInterval (%s, the default); the producer registers at a random instant of the interval, "+
			"as items arrive when they do. No raw pgx row: this is pgbaton against itself.", claimWaitPoll),
		metrics:  []metric{{name: "p50 ms", format: "%.3f"}, {name: "p99 ms", format: "%.3f"}},
		noRatios: true,
	}
	for _, noListen := range []bool{false, true} {
		name := "pgbaton ClaimWait, LISTEN"
		if noListen {
			name = fmt.Sprintf("pgbaton ClaimWait, NoListen (PollInterval %s)", claimWaitPoll)
		}
		var pool *pgxpool.Pool
		var worker, producer *leasetable.Client
		waiting := make(chan struct{}, 1)
		im := &impl{name: name}
		im.setup = func(ctx context.Context) (err error) {
			if pool, err = e.pool(ctx, "bench-pgbaton-claimwait", 4); err != nil {
				return err
			}
			cfg := leasetable.Config{Owner: "bench-worker", TTL: 15 * time.Second, NoListen: noListen, PollInterval: claimWaitPoll,
				Logger: slog.New(waitHook{msg: "pgbaton: waiting to claim", ch: waiting})}
			if worker, err = leasetable.New(ctx, pool, cfg); err != nil {
				return err
			}
			producer, err = leasetable.New(ctx, pool, leasetable.Config{Owner: "bench-producer", TTL: 15 * time.Second})
			return err
		}
		im.teardown = func(ctx context.Context) error {
			err := worker.Close(ctx)
			if cerr := producer.Close(ctx); err == nil {
				err = cerr
			}
			pool.Close()
			return err
		}
		group := "bench:claimwait"
		if noListen {
			group += ":nolisten"
		}
		im.run = func(ctx context.Context) (sample, error) {
			lat := make([]time.Duration, 0, e.samples)
			for s := range e.samples {
				type got struct {
					ls  []*leasetable.Lease
					at  time.Time
					err error
				}
				select {
				case <-waiting: // left by the previous sample's last look
				default:
				}
				done := make(chan got, 1)
				go func() {
					ls, err := worker.ClaimWait(ctx, group, 1)
					done <- got{ls, time.Now(), err}
				}()
				select {
				case <-waiting:
				case g := <-done:
					return nil, fmt.Errorf("ClaimWait returned on an empty queue: %v", g.err)
				}
				if noListen {
					t := time.NewTimer(rand.N(claimWaitPoll))
					select {
					case <-t.C:
					case <-ctx.Done():
						t.Stop()
						return nil, ctx.Err()
					}
				}
				t0 := time.Now()
				if _, err := producer.Register(ctx, group, fmt.Sprintf("item-%d", s)); err != nil {
					return nil, err
				}
				g := <-done
				if g.err != nil {
					return nil, g.err
				}
				lat = append(lat, g.at.Sub(t0))
				if err := worker.Complete(ctx, g.ls...); err != nil {
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
