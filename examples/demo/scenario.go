package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/pgbaton/pgbaton/fencedwrite"
)

// scenarioResult is what the scenario observed, for the summary.
type scenarioResult struct {
	killed, paused       int
	killedAt, pausedAt   time.Time // database clock
	killedItems          []string
	killedWasLeader      bool
	pausedItem           string
	pausedToken          int64
	staleRejected        []demoEvent
	errors               []demoEvent
	pauseTakeoverToken   int64
	leaders, slotsRun    int
	processedByWorker    map[int]int
	processedDuringPause int
}

// staleWhy says why the fence rejected a write, in the demo's words.
func staleWhy(ev demoEvent) string {
	if fencedwrite.Reason(ev.Detail) == fencedwrite.ReasonNoLease {
		return "no such lease: " + ev.Item + " was completed meanwhile, or never granted"
	}
	return fmt.Sprintf("current token %d, %s", ev.Current, ev.Detail)
}

func (r *demoRun) scenario(ctx context.Context, victim, items int) (*scenarioResult, error) {
	res := &scenarioResult{processedByWorker: map[int]int{}}
	leader := 0
	processed := 0
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	paused := false
	for {
		// A worker SIGKILLed right after committing an item never reports
		// it: besides the events, look at the database once a second.
		tick := false
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: the scenario did not finish in time (%d of %d items processed)", errInvariant, processed, items)
		case id := <-r.exited:
			if id != res.killed {
				return nil, fmt.Errorf("%w: worker %d exited unexpectedly", errInvariant, id)
			}
		case <-progress.C:
			tick = true
			who := "none (election under way)"
			if leader != 0 {
				who = fmt.Sprintf("worker %d", leader)
			}
			r.logf("progress: %d/%d items processed, %d slots run, leader %s", processed, items, res.slotsRun, who)
		case ev := <-r.events:
			switch ev.Kind {
			case "ready":
				r.owners[ev.Worker] = ev.Detail
			case "leader":
				leader = ev.Worker
				res.leaders++
				r.logf("worker %d is leader, term %d", ev.Worker, ev.Token)
			case "slot":
				res.slotsRun++
			case "processed":
				processed++
				res.processedByWorker[ev.Worker]++
				if paused {
					res.processedDuringPause++
				}
			case "stale":
				res.staleRejected = append(res.staleRejected, ev)
				r.logf("worker %d woke up and tried to write %s with token %d: REJECTED by the fence (%s)",
					ev.Worker, ev.Item, ev.Token, staleWhy(ev))
			case "error":
				res.errors = append(res.errors, ev)
				r.logf("worker %d error: %s", ev.Worker, ev.Detail)
			case "resumed":
				paused = false
				res.pauseTakeoverToken = ev.Current
				r.logf("%s was granted again (token %d, or already done): SIGCONT worker %d", ev.Item, ev.Current, ev.Worker)
			case "holding":
				if res.paused == 0 && res.killed != 0 && ev.Worker == victim {
					if err := r.pause(ctx, res, ev, &paused); err != nil {
						return nil, err
					}
				}
			}
		}
		// First fault: once work and leadership are under way, kill the
		// leader mid-job.
		if res.killed == 0 && leader != 0 && processed >= items/5 {
			if err := r.kill(ctx, res, leader); err != nil {
				return nil, err
			}
			leader = 0
		}
		if (processed >= items || tick) && res.paused != 0 && !paused {
			left, err := r.q.DemoProcessedCount(ctx, r.pool)
			if err != nil {
				return nil, err
			}
			if int(left.Items) >= items && len(res.staleRejected) > 0 {
				r.logf("all %d items processed", items)
				return res, nil
			}
		}
	}
}

func (r *demoRun) kill(ctx context.Context, res *scenarioResult, id int) error {
	held, err := r.q.DemoHeldBy(ctx, r.pool, r.owners[id])
	if err != nil {
		return err
	}
	if err := r.workers[id].Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	res.killedAt, err = r.q.DemoNow(ctx, r.pool)
	if err != nil {
		return err
	}
	res.killed, res.killedWasLeader = id, true
	for _, n := range held {
		if n != demoLeader {
			res.killedItems = append(res.killedItems, n)
		}
	}
	r.logf("SIGKILL worker %d (the leader) while it holds %d items: its leases must expire before anyone else gets them", id, len(res.killedItems))
	return nil
}

// pause SIGSTOPs the victim while it holds ev.Item, waits until another
// worker has taken the item over (its lease expired), then SIGCONTs it.
func (r *demoRun) pause(ctx context.Context, res *scenarioResult, ev demoEvent, paused *bool) error {
	if err := r.workers[ev.Worker].Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	var err error
	if res.pausedAt, err = r.q.DemoNow(ctx, r.pool); err != nil {
		return err
	}
	res.paused, res.pausedItem, res.pausedToken = ev.Worker, ev.Item, ev.Token
	*paused = true
	r.logf("SIGSTOP worker %d while it holds %s (token %d), past its %s lease", ev.Worker, ev.Item, ev.Token, demoTTL)
	go func() {
		// Resume once someone else holds or finished the item.
		var took int64
		for ctx.Err() == nil {
			cur, err := r.q.DemoLeaseOf(ctx, r.pool, ev.Item)
			if err != nil || cur.Token > ev.Token {
				took = cur.Token
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = r.workers[ev.Worker].Process.Signal(syscall.SIGCONT)
		r.send(demoEvent{Kind: "resumed", Worker: ev.Worker, Item: ev.Item, Current: took})
	}()
	return nil
}
