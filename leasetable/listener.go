package leasetable

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
)

// notifyChannel is the channel pgbaton.release notifies, with the lease
// name as payload.
const notifyChannel = "pgbaton_lease"

// listener holds the client's one LISTEN connection, shared by every
// waiter, and wakes the waiters of a name when its release is notified.
// It starts with the first waiter and runs until the client closes.
type listener struct {
	c *Client

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	ready   chan struct{} // closed while LISTEN is active
	started bool
	closed  bool
	// connected is set after the first connection: from then on a new
	// connection means releases may have been missed.
	connected bool
	stop      context.CancelFunc
	done      chan struct{}

	// lastErr is why the last connection failed; down is since when no
	// connection listens (zero while one does).
	lastErr error
	down    time.Time
	// probes are Client.Check payloads in flight, closed when delivered.
	probes map[string]chan struct{}
}

func newListener(c *Client) *listener {
	return &listener{c: c, waiters: make(map[string]map[chan struct{}]struct{}), ready: make(chan struct{}),
		probes: make(map[string]chan struct{})}
}

// subscribe registers a wake-up channel for notifications naming any of
// names (leases or groups) and returns once the listening connection is
// active, so no release after it can be missed.
func (ln *listener) subscribe(ctx context.Context, names ...string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{}, 1)
	ln.mu.Lock()
	if ln.closed {
		ln.mu.Unlock()
		return nil, nil, pgbaton.ErrClosed
	}
	for _, n := range names {
		set := ln.waiters[n]
		if set == nil {
			set = make(map[chan struct{}]struct{})
			ln.waiters[n] = set
		}
		set[ch] = struct{}{}
	}
	if !ln.started {
		ln.started = true
		ctx, cancel := context.WithCancel(context.Background())
		ln.stop, ln.done = cancel, make(chan struct{})
		go ln.run(ctx)
	}
	ready := ln.ready
	ln.mu.Unlock()

	unsubscribe := func() {
		ln.mu.Lock()
		defer ln.mu.Unlock()
		for _, n := range names {
			if set := ln.waiters[n]; set != nil {
				delete(set, ch)
				if len(set) == 0 {
					delete(ln.waiters, n)
				}
			}
		}
	}
	select {
	case <-ready:
		return ch, unsubscribe, nil
	case <-ctx.Done():
		unsubscribe()
		return nil, nil, fmt.Errorf("leasetable: waiting for the LISTEN connection: %w", context.Cause(ctx))
	case <-ln.c.bg.Done():
		unsubscribe()
		return nil, nil, pgbaton.ErrClosed
	}
}

// wake signals the waiters of name, or of every name when all is set.
func (ln *listener) wake(name string, all bool) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	signal := func(set map[chan struct{}]struct{}) {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default: // already signalled
			}
		}
	}
	if all {
		for _, set := range ln.waiters {
			signal(set)
		}
		return
	}
	signal(ln.waiters[name])
}

func (ln *listener) run(ctx context.Context) {
	defer close(ln.done)
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		err := ln.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		ln.mu.Lock()
		ln.lastErr = err
		if ln.down.IsZero() {
			ln.down = time.Now()
		}
		ln.mu.Unlock()
		ln.c.log.Warn("pgbaton: lease LISTEN connection failed; reconnecting", "error", err, "in", backoff)
		t := time.NewTimer(backoff + rand.N(backoff))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

// listen runs one connection until it fails.
func (ln *listener) listen(ctx context.Context) error {
	pc, err := ln.c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection leaves the pool: a pooled connection would be reused
	// by others while subscribed, or closed by pool lifetime limits.
	conn := pc.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if err := ln.c.q.LeaseListen(ctx, conn); err != nil {
		return err
	}
	ln.mu.Lock()
	close(ln.ready)
	missed := ln.connected
	ln.connected = true
	downFor := time.Since(ln.down)
	ln.down = time.Time{}
	ln.mu.Unlock()
	if missed {
		ln.c.log.Info("pgbaton: lease LISTEN connection re-established; waiters look again", "down_for", downFor)
		// Releases while no connection listened were missed: everyone
		// looks again.
		ln.wake("", true)
	}
	defer func() {
		ln.mu.Lock()
		ln.ready = make(chan struct{})
		ln.mu.Unlock()
	}()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		ln.dispatch(n)
	}
}

func (ln *listener) dispatch(n *pgconn.Notification) {
	if n.Channel != notifyChannel {
		return
	}
	ln.mu.Lock()
	if ch, ok := ln.probes[n.Payload]; ok {
		close(ch)
		delete(ln.probes, n.Payload)
	}
	ln.mu.Unlock()
	ln.wake(n.Payload, false)
}

// check proves the LISTEN connection, if started, delivers notifications:
// it sends payload on the channel through the pool and waits for it to
// come back. A connection can look open and deliver nothing (a silent
// network, a backend stuck); only a round trip tells.
func (ln *listener) check(ctx context.Context, payload string) error {
	ln.mu.Lock()
	if !ln.started || ln.closed {
		ln.mu.Unlock()
		return nil
	}
	select {
	case <-ln.ready:
	default:
		err := errors.New("leasetable: LISTEN connection not connected yet")
		if !ln.down.IsZero() {
			err = fmt.Errorf("leasetable: LISTEN connection down for %s, reconnecting (last error: %v); waiters wake only at expiries",
				time.Since(ln.down).Round(time.Millisecond), ln.lastErr)
		}
		ln.mu.Unlock()
		return err
	}
	got := make(chan struct{})
	ln.probes[payload] = got
	ln.mu.Unlock()
	defer func() {
		ln.mu.Lock()
		delete(ln.probes, payload)
		ln.mu.Unlock()
	}()
	if err := ln.c.q.LeaseNotify(ctx, ln.c.pool, payload); err != nil {
		return ln.c.dbError("notify for the LISTEN check", err)
	}
	select {
	case <-got:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leasetable: LISTEN connection did not deliver a notification in time: %w", context.Cause(ctx))
	}
}

func (ln *listener) close() {
	ln.mu.Lock()
	ln.closed = true
	stop, done := ln.stop, ln.done
	ln.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}
