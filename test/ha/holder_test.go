//go:build ha

package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/test/check"
)

// The holders: two clients that take turns holding one lease for as long
// as they can, renewing it continuously through the fault, so that a
// lease is held whenever a fault strikes. What is checked is the
// contract of a lease as its holders see it: the holder learns of the
// loss before anyone else can be granted the lease. Each holder records
// the interval from its grant to being told the lease is lost (or to its
// release), by the test's one monotonic clock, and no two intervals may
// overlap.
//
// The pinned holder reaches the phase's first leader only (its own
// single-host URL), as a client cut off from the new primary would: it
// learns of the loss at its local deadline, the latest the contract
// allows, which is the case a failover grace must cover. It takes the
// lease first. The roaming holder uses the cluster's URL and waits for
// the lease in Acquire all along.
//
// holderTTL is longer than a failover takes (about 5 s) plus the roaming
// holder's way to the new primary, and the holders keep their lease sessions
// alive every holderRenew: the pinned holder's deadline (holderTTL -
// SafetyMargin after its last keep-alive, just before the fault) lies
// well after the new primary is up, while in the lag phase the lagging
// standby's copy of its lease session (last kept alive lagFor before the
// fault) expires about when it is promoted. Without a failover grace the
// roaming holder got the lease there about 1.5 s before the pinned one
// was told.
const (
	holderTTL   = 10 * time.Second
	holderRenew = 500 * time.Millisecond
)

const (
	pinnedProc  = 401
	roamingProc = 402
)

// span is one holder's hold of the lease, by MonoNow.
type span struct {
	client     string
	token      int64
	start, end int64
	lost       bool // ended by the holder being told it is lost
	ongoing    bool // still held when the workload stopped
}

// holderOverlap is two spans of different holders that overlap.
type holderOverlap struct {
	a, b span
	d    time.Duration
}

func (o holderOverlap) String() string {
	return fmt.Sprintf("%s token %d [%d..%d lost=%t] and %s token %d [%d..%d lost=%t] overlap %s",
		o.a.client, o.a.token, o.a.start/1e6, o.a.end/1e6, o.a.lost, o.b.client, o.b.token, o.b.start/1e6, o.b.end/1e6, o.b.lost, o.d)
}

// holderOverlaps returns every pair of spans of different holders that
// overlap.
func holderOverlaps(spans []span) []holderOverlap {
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	var out []holderOverlap
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if b.start >= a.end {
				break
			}
			if a.client != b.client {
				out = append(out, holderOverlap{a, b, time.Duration(min(a.end, b.end) - b.start)})
			}
		}
	}
	return out
}

func (w *workload) addSpan(s span) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.spans = append(w.spans, s)
}

func (w *workload) snapshotSpans() []span {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]span(nil), w.spans...)
}

// startHolders starts the pinned holder, waits until it holds the lease,
// then starts the roaming one.
func (w *workload) startHolders(ctx context.Context) error {
	first := make(chan struct{})
	for i, h := range []struct {
		url  string
		proc int
	}{{w.pinnedURL, pinnedProc}, {w.url, roamingProc}} {
		c := w.newClient("holder", i)
		c.procs = []int{h.proc}
		pool, err := w.poolAt(ctx, c, h.url)
		if err != nil {
			return err
		}
		lc, err := leasetable.New(ctx, pool, leasetable.Config{Owner: c.name, TTL: holderTTL, RenewInterval: holderRenew, Logger: slog.New(errorLog{c})})
		if err != nil {
			pool.Close()
			return err
		}
		var granted chan<- struct{}
		if h.proc == pinnedProc {
			granted = first
		}
		w.wg.Go(func() {
			defer pool.Close()
			defer lc.Close(context.WithoutCancel(ctx))
			w.holder(ctx, c, lc, granted)
		})
		if h.proc == pinnedProc {
			select {
			case <-first:
			case <-time.After(10 * time.Second):
				return errors.New("the pinned holder did not get the lease within 10 s")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// holder acquires the phase's held lease, holds it until it is told the
// lease is lost or the workload stops, and goes round again. granted, if
// set, is closed at its first grant.
func (w *workload) holder(ctx context.Context, c *client, lc *leasetable.Client, granted chan<- struct{}) {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for !w.stopping.Load() && hctx.Err() == nil {
			sleepUnless(hctx, 20*time.Millisecond)
		}
		cancel()
	}()
	key := w.key("held")
	for hctx.Err() == nil {
		l, err := lc.Acquire(hctx, key)
		if err != nil {
			// The pinned holder cannot reach a new primary; nothing to
			// record.
			sleepUnless(hctx, 100*time.Millisecond)
			continue
		}
		s := span{client: c.name, token: l.Token(), start: check.MonoNow()}
		c.success(s.start)
		if granted != nil {
			close(granted)
			granted = nil
		}
		select {
		case <-l.Done():
			s.end, s.lost = check.MonoNow(), errors.Is(l.Err(), leasetable.ErrLeaseLost)
		case <-hctx.Done():
			s.end, s.ongoing = check.MonoNow(), true
		}
		w.addSpan(s)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = l.Release(rctx) // what is lost or stopped is given back if it can be
		rcancel()
	}
}

// graceState is pgbaton.failover_grace() as the phase's checks need it.
type graceState struct {
	known      bool // the function exists
	timeline   int64
	started    time.Time
	until      time.Time
	ttlInUseMs int64
}

func readGrace(ctx context.Context, pool *pgxpool.Pool) graceState {
	var g graceState
	var started, until *time.Time
	var tl *int64
	err := pool.QueryRow(ctx, "SELECT to_timeline, started_at, grace_until, ttl_in_use_ms FROM pgbaton.failover_grace()").
		Scan(&tl, &started, &until, &g.ttlInUseMs)
	if err != nil {
		return g
	}
	g.known = true
	if tl != nil {
		g.timeline = *tl
	}
	if started != nil && until != nil {
		g.started, g.until = *started, *until
	}
	return g
}

// imposed is the grace a timeline change between before and g imposed,
// or 0 when the timeline did not change (or the database has no grace).
func (g graceState) imposed(before graceState) time.Duration {
	if !g.known || g.timeline == before.timeline || g.started.IsZero() {
		return 0
	}
	return g.until.Sub(g.started)
}
