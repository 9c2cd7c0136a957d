package leasetable

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/appname"
	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/serverkind"
)

// notifyChannel is the channel pgbaton.notify_waiters notifies, with the lease
// name as payload.
const notifyChannel = "pgbaton_lease"

// listener holds the client's one LISTEN connection, shared by every
// waiter, and wakes the waiters of a name when its release is notified.
// A waiter starts it when a listen slot is free; it runs until the client
// closes, until every slot turns out taken, or until nobody has waited
// for slotKeep, and a later waiter starts it again.
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
	// undelivered is why waiters poll although the client was meant to
	// listen: a LISTEN connection that delivers no notification (a
	// transaction pooler). Nil while notifications work.
	undelivered error
	// regs are the waiters' registrations in pgbaton.lease_waiter, by
	// waiter id. That table is unlogged: a crash empties it, and so does a
	// failover (a promoted standby has no unlogged rows). A new LISTEN
	// connection registers them all again before waking the waiters.
	regs map[string]registration
	// stops are registrations of waiters that stopped waiting, for the
	// LISTEN connection to remove (flushStops) the next time it wakes,
	// within listenLinger. Removed on the pool instead, from a goroutine
	// of its own, the removal ran beside the granted caller's next call
	// (Renew, Release) and made its pool open a second connection (200
	// clients: see deferStop).
	stops []waiterRef
	// kick asks a run loop waiting out its backoff to reconnect now, or
	// an idle connection to listen again: a waiter subscribed and needs
	// the connection (buffered, 1).
	kick chan struct{}
	// idle: the connection is open but does not listen, as nobody waits
	// (pause); quietSince is since when nobody has waited.
	idle       bool
	quietSince time.Time
	// keep is slotKeep when the client was made; grace and stopped,
	// closeGrace and listenerStopped.
	keep    time.Duration
	grace   time.Duration
	stopped func()
	// slotTried is when the client last found every listen slot taken
	// (Config.ListenSlots): it opens no LISTEN connection then, its
	// waiters poll, and a waiter arriving a slotRetry later asks again.
	slotTried time.Time
	// slotsTakenSaid: the client logged that it found every slot taken.
	slotsTakenSaid bool
}

// slotsTaken logs, once per client, that it found every listen slot taken
// and its waiters poll: in a fleet larger than Config.ListenSlots that is
// by design, and otherwise the sign of a session outside pgbaton holding
// the slots' advisory keys.
func (ln *listener) slotsTaken() {
	ln.mu.Lock()
	said := ln.slotsTakenSaid
	ln.slotsTakenSaid = true
	ln.mu.Unlock()
	if !said {
		ln.c.log.Info("pgbaton: every listen slot is taken; this client's waiters poll (from 50ms up to PollInterval) until one is free. Expected when more clients than ListenSlots wait at once; otherwise see who holds the advisory keys (1885495924, 0..ListenSlots-1): SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885495924",
			"listen_slots", ln.c.cfg.ListenSlots, "poll_interval", ln.c.cfg.PollInterval)
	}
}

// slotRetry is how often a client without a listen slot asks again for
// one, at most (when a waiter arrives).
const slotRetry = time.Second

// slotKeep is how long a client keeps its listen slot, and the LISTEN
// connection that holds it, after its last waiter left (not listening
// meanwhile: see listenLinger). Then it frees both, so clients that
// stopped waiting give their slots to those that wait now. Kept between
// waits, a slot spares the server a backend start per wait (200 clients
// on 2 cores that opened and closed LISTEN connections as they waited:
// acquire p99 0.8 to 2.6 s against 0.13 s without LISTEN).
var slotKeep = 30 * time.Second // a var for tests: read once per client

// errNoSlot and errIdle end a LISTEN connection on purpose: every listen
// slot was taken, or nobody waited for slotKeep.
var (
	errNoSlot = errors.New("leasetable: every listen slot is taken")
	errIdle   = errors.New("leasetable: nobody waits")
)

// registration is one row of pgbaton.lease_waiter.
type registration = db.LeaseWaitForParams

// waiterRef names one row of pgbaton.lease_waiter.
type waiterRef struct{ name, id string }

// maxStops bounds the removals kept for a LISTEN connection that is down;
// beyond it they go on the pool (see waiting.stop).
const maxStops = 1024

func newListener(c *Client) *listener {
	return &listener{c: c, waiters: make(map[string]map[chan struct{}]struct{}), ready: make(chan struct{}),
		probes: make(map[string]chan struct{}), regs: make(map[string]registration), kick: make(chan struct{}, 1),
		keep: slotKeep, grace: closeGrace, stopped: listenerStopped}
}

// subscription is how a subscribed waiter learns of releases.
type subscription int

const (
	// listening: the LISTEN connection is active, so no release after
	// subscribe returned can be missed once the waiter is registered.
	listening subscription = iota
	// polling: by configuration (NoListen) or because the LISTEN
	// connection does not deliver (a transaction pooler): every
	// PollInterval.
	polling
	// pollingBackoff: the client holds no listen slot, or its LISTEN
	// connection was not up within listenReadyWait: from slotlessPoll,
	// doubling up to PollInterval.
	pollingBackoff
)

// listenReadyWait is how long a waiter waits for the LISTEN connection to
// come up (opened, reopened, listening again) before it polls instead: a
// server slow to accept connections must not fail waits that polling
// would serve (a fleet of 200 clients on 2 cores: waits ended with "waiting
// for the LISTEN connection: context deadline exceeded" after 5 s).
const listenReadyWait = 250 * time.Millisecond

// subscribe registers a wake-up channel for notifications naming any of
// names (leases or groups) and returns once the listening connection is
// active, so no release after it can be missed, or once it is clear the
// waiter must poll (see subscription).
func (ln *listener) subscribe(ctx context.Context, names ...string) (<-chan struct{}, func(), subscription, error) {
	ch := make(chan struct{}, 1)
	ln.mu.Lock()
	if ln.closed {
		ln.mu.Unlock()
		return nil, nil, 0, pgbaton.ErrClosed
	}
	if ln.c.cfg.NoListen {
		// Waiters poll; nothing will wake them early.
		ln.mu.Unlock()
		return ch, func() {}, polling, nil
	}
	for _, n := range names {
		set := ln.waiters[n]
		if set == nil {
			set = make(map[chan struct{}]struct{})
			ln.waiters[n] = set
		}
		set[ch] = struct{}{}
	}
	started := ln.started
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
	// No LISTEN connection is opened while every listen slot is taken.
	if !started && !ln.slotFree(ctx) {
		return ch, unsubscribe, pollingBackoff, nil
	}
	ln.mu.Lock()
	if ln.closed {
		ln.mu.Unlock()
		unsubscribe()
		return nil, nil, 0, pgbaton.ErrClosed
	}
	if !ln.started {
		ln.started = true
		ctx, cancel := context.WithCancel(context.Background())
		ln.stop, ln.done = cancel, make(chan struct{})
		go ln.run(ctx)
	}
	ready := ln.ready
	ln.mu.Unlock()
	select {
	case <-ready:
		return ch, unsubscribe, ln.mode(), nil
	default:
		select {
		case ln.kick <- struct{}{}:
		default: // already kicked
		}
	}
	t := time.NewTimer(listenReadyWait)
	defer t.Stop()
	select {
	case <-ready:
		return ch, unsubscribe, ln.mode(), nil
	case <-t.C:
		return ch, unsubscribe, pollingBackoff, nil
	case <-ctx.Done():
		unsubscribe()
		return nil, nil, 0, fmt.Errorf("leasetable: waiting for the LISTEN connection: %w", context.Cause(ctx))
	case <-ln.c.bg.Done():
		unsubscribe()
		return nil, nil, 0, pgbaton.ErrClosed
	}
}

// polling reports whether waiters poll rather than wait for
// notifications: by configuration (NoListen), because the LISTEN
// connection does not deliver them, because the client holds no listen
// slot, or because its connection is not listening now (connecting, or
// down and reconnecting).
func (ln *listener) polling() bool { return ln.mode() != listening }

// mode is how a waiter subscribing now learns of releases, once the
// LISTEN connection is ready.
func (ln *listener) mode() subscription {
	if ln.c.cfg.NoListen {
		return polling
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	switch {
	case ln.undelivered != nil:
		return polling
	case !ln.started:
		return pollingBackoff // no listen slot was free
	}
	select {
	case <-ln.ready:
		return listening
	default:
		// Not listening now (connecting, reconnecting, or between
		// waits): a subscriber that saw the connection ready just
		// before must not count on notifications.
		return pollingBackoff
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
	// Ended for good: no later connection removes what is left, and
	// deferStop takes no more (started, closed or undelivered says so).
	defer func() { ln.c.stopWaitingOnPool(ln.takeStops()) }()
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	defer context.AfterFunc(ctx, func() {
		if ln.stopped != nil {
			ln.stopped()
		}
		time.AfterFunc(ln.grace, qcancel)
	})()
	// Capped low: while the connection is down, releases wake nobody.
	retry := backoff.Backoff{Min: 10 * time.Millisecond, Max: 250 * time.Millisecond}
	for ctx.Err() == nil {
		err := ln.listen(ctx, qctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoSlot) || errors.Is(err, errIdle) {
			ln.mu.Lock()
			ln.started, ln.down, ln.lastErr = false, time.Time{}, nil
			// Registrations made on an earlier connection are made again
			// by the next one (connected marks that there are some).
			ln.connected = len(ln.regs) > 0
			noSlot := errors.Is(err, errNoSlot)
			if noSlot {
				ln.slotTried = time.Now()
			}
			select {
			case <-ln.ready:
			default:
				close(ln.ready) // subscribers waiting for it poll
			}
			ln.ready = make(chan struct{})
			ln.mu.Unlock()
			if noSlot {
				ln.slotsTaken()
			}
			ln.wake("", true) // waiters that counted on it poll from now on
			return
		}
		if errors.Is(err, errUndelivered) {
			// Reconnecting would not help: waiters poll from now on.
			ln.c.log.Warn("pgbaton: notifications are not delivered on the lease LISTEN connection (a transaction pooler such as PgBouncer in transaction mode?); waiters poll at the holder's expiry, at most every PollInterval. Set Config.ListenDSN to a direct connection to wake them at once.",
				"poll_interval", ln.c.cfg.PollInterval)
			ln.mu.Lock()
			ln.undelivered = err
			select {
			case <-ln.ready:
			default:
				close(ln.ready) // subscribers stop waiting for a connection
			}
			ln.mu.Unlock()
			ln.wake("", true) // those already waiting switch to polling
			return
		}
		ln.mu.Lock()
		ln.lastErr = err
		if ln.down.IsZero() {
			ln.down = time.Now()
		}
		ln.mu.Unlock()
		d := retry.Next()
		ln.c.log.Warn("pgbaton: lease LISTEN connection failed; reconnecting", "error", err, "in", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ln.kick:
			// A waiter needs the connection: the server it failed to
			// reach may well be back (a waiter subscribes only after a
			// look at the lease succeeded).
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// slotFree reports whether the client may open a LISTEN connection: a
// listen slot is free, asked on the pool for the subscribing waiter (it
// is about to wait, so the question takes no second pool connection), at
// most once a slotRetry. An error counts as no: the waiter polls, and its
// own looks meet the error.
func (ln *listener) slotFree(ctx context.Context) bool {
	ln.mu.Lock()
	if time.Since(ln.slotTried) < slotRetry {
		ln.mu.Unlock()
		return false
	}
	// Set before asking: the client's other waiters poll meanwhile.
	ln.slotTried = time.Now()
	ln.mu.Unlock()
	free, err := inFlight(ln.c, ctx, func(ctx context.Context) (bool, error) {
		return ln.c.q.LeaseListenSlotFree(ctx, ln.c.pool, int32(ln.c.cfg.ListenSlots))
	}, nil)
	if err == nil && !free {
		ln.slotsTaken()
	}
	return err == nil && free
}

// errUndelivered: the LISTEN connection delivered no notification.
var errUndelivered = errors.New("leasetable: notifications sent on the LISTEN connection's channel were not delivered")

// closeGrace is how long a statement on the LISTEN connection may go on
// once the client closes. Cancelling a statement closes the connection
// (pgx), and a backend whose connection was closed frees its listen slot
// only once it has finished exiting, after Close returned (CI saw the slot
// still in pg_locks). So a closing listener lets the statement in flight
// finish and frees the slot itself; a server that stopped answering holds
// Close up to twice this: the statement, then the slot's release.
var closeGrace = time.Second // a var for tests: read once per client

// listenerStopped, if set (tests), is called when a listener is told to
// stop, before its closeGrace starts. Read once per client.
var listenerStopped func()

// listen runs one connection until it fails or ctx ends. Statements on
// the connection run under qctx, which ends a closeGrace after ctx; waits
// end with ctx.
func (ln *listener) listen(ctx, qctx context.Context) error {
	conn, err := ln.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), ln.grace)
		defer cancel()
		if !conn.IsClosed() {
			_ = ln.flushStops(closeCtx, conn)
			// The slot is freed before Close returns (see closeGrace).
			_ = ln.c.q.LeaseListenStop(closeCtx, conn)
		}
		_ = conn.Close(closeCtx)
	}()
	if err := ln.c.q.LeaseListen(qctx, conn); err != nil {
		return err
	}
	// Prove that it delivers: behind a transaction pooler LISTEN succeeds
	// but its notifications go to whichever client uses the server
	// connection next, or nowhere.
	if err := ln.probe(ctx, conn); err != nil {
		return err
	}
	listening, err := ln.c.q.LeaseListenStart(qctx, conn, int32(ln.c.cfg.ListenSlots))
	if err != nil {
		return err
	}
	if !listening {
		// Taken since the client asked: close the connection, poll.
		return errNoSlot
	}
	ln.mu.Lock()
	missed := ln.connected
	ln.mu.Unlock()
	if missed {
		// The server may have lost the registrations (a crash, a
		// failover): make them again, now that LISTEN is active.
		if err := ln.reregister(qctx, conn); err != nil {
			return err
		}
	}
	ln.mu.Lock()
	close(ln.ready)
	ln.connected = true
	wasDown, downFor := !ln.down.IsZero(), time.Since(ln.down)
	ln.down = time.Time{}
	ln.mu.Unlock()
	if missed {
		if wasDown {
			ln.c.log.Info("pgbaton: lease LISTEN connection re-established; waiters look again", "down_for", downFor)
		}
		// Releases while no connection listened were missed: everyone
		// looks again.
		ln.wake("", true)
	}
	defer func() {
		ln.mu.Lock()
		select {
		case <-ln.ready:
			ln.ready = make(chan struct{})
		default: // not ready already (paused): its subscribers keep it
		}
		ln.idle = false
		ln.mu.Unlock()
	}()
	for {
		if err := ln.flushStops(qctx, conn); err != nil {
			return err
		}
		// Woken at least every listenLinger to see whether anyone still
		// waits. A deadline, not a cancel request: the connection stays
		// usable (pgconn keeps it open on a timeout).
		wctx, cancel := context.WithTimeout(ctx, listenLinger)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			ln.dispatch(n)
		case ctx.Err() == nil && pgconn.Timeout(err) && !conn.IsClosed():
			if err := ln.pause(ctx, qctx, conn); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// listenLinger is how long the LISTEN connection keeps listening after
// its last waiter left. Every NOTIFY in the database signals every
// backend that listens, on any channel, and each sends the notification
// to its client: a fleet of clients that all listened all the time spent
// the server's CPU on deliveries nobody waited for (with 200 clients,
// acquire p50 578 ms against 3 ms without LISTEN). Listening only while
// waiting keeps the signalled backends to the clients that wait, and the
// listen slots (Config.ListenSlots) to a bounded number of those.
const listenLinger = 100 * time.Millisecond

// pause stops listening when nobody has waited for listenLinger, and
// listens again when a waiter subscribes. Subscribers arriving meanwhile
// find ready open and wait for it: the switch is made under ln.mu before
// UNLISTEN, so a waiter never counts on a connection that stopped
// listening.
func (ln *listener) pause(ctx, qctx context.Context, conn *pgx.Conn) error {
	ln.mu.Lock()
	if len(ln.waiters) > 0 || len(ln.probes) > 0 {
		ln.quietSince = time.Time{}
		ln.mu.Unlock()
		return nil
	}
	if ln.quietSince.IsZero() {
		ln.quietSince = time.Now()
	}
	if time.Since(ln.quietSince) < listenLinger {
		ln.mu.Unlock()
		return nil
	}
	ln.ready = make(chan struct{})
	ln.idle = true
	ln.quietSince = time.Time{}
	ln.mu.Unlock()
	if err := ln.c.q.LeaseUnlisten(qctx, conn); err != nil {
		return err
	}
	t := time.NewTimer(ln.keep)
	defer t.Stop()
	select {
	case <-ln.kick:
	case <-t.C:
		if err := ln.flushStops(qctx, conn); err != nil {
			return err
		}
		if err := ln.c.q.LeaseListenStop(qctx, conn); err != nil {
			return err
		}
		return errIdle
	case <-ctx.Done():
		return ctx.Err()
	}
	return ln.start(qctx, conn)
}

// start takes a listen slot and listens again, or, with every slot taken,
// leaves the connection silent and makes waiters poll. Either way
// subscribers stop waiting for ready.
func (ln *listener) start(ctx context.Context, conn *pgx.Conn) error {
	listening, err := ln.c.q.LeaseListenStart(ctx, conn, int32(ln.c.cfg.ListenSlots))
	if err != nil {
		return err
	}
	if !listening {
		return errNoSlot
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	ln.idle = false
	select {
	case <-ln.ready:
	default:
		close(ln.ready)
	}
	return nil
}

// connect opens the LISTEN connection: to Config.ListenDSN, or with the
// pool's connection settings (its BeforeConnect and AfterConnect hooks
// run, as for the pool's own connections: credentials that are made per
// connection work). It is a connection of its own rather than one taken
// out of the pool: the pool keeps its connections, whose backends have
// compiled pgbaton's functions and cached their plans, instead of
// replacing one with a cold backend (a fleet of 100 clients whose first
// waits all came within a few seconds spent the server on it: 197
// acquires/s against 556 without LISTEN). A pooled connection would not
// do either: others would use it while subscribed, and pool lifetime
// limits would close it. Either way it names pgbaton and the owner in
// application_name, so pg_stat_activity shows whose it is.
func (ln *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	app := appname.Of("lease listener", ln.c.cfg.Owner)
	if dsn := ln.c.cfg.ListenDSN; dsn != "" {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = app
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := serverkind.CheckConn(ctx, conn); err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
		return conn, nil
	}
	pcfg := ln.c.pool.Config() // a copy, ConnConfig included
	cfg := pcfg.ConnConfig
	if pcfg.BeforeConnect != nil {
		if err := pcfg.BeforeConnect(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = make(map[string]string)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if pcfg.AfterConnect != nil {
		if err := pcfg.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}

// probe sends a notification through the pool and waits for conn to
// deliver it.
func (ln *listener) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := ln.c.waiterPrefix + "probe/" + strconv.FormatInt(ln.c.waiterSeq.Add(1), 10)
	if err := ln.c.q.LeaseNotify(ctx, ln.c.pool, payload); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout(ln.c.cfg.TTL))
	defer cancel()
	for {
		n, err := conn.WaitForNotification(pctx)
		switch {
		case err != nil && ctx.Err() == nil && pctx.Err() != nil:
			return errUndelivered
		case err != nil:
			return err
		case n.Channel == notifyChannel && n.Payload == payload:
			return nil
		}
		ln.dispatch(n)
	}
}

// probeTimeout is how long the first notification may take: on a working
// connection it comes back in a round trip.
func probeTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 250*time.Millisecond), time.Second)
}

// register records a waiter's registration, to be made again on a new
// connection.
func (ln *listener) register(id string, r registration) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	ln.regs[id] = r
}

// unregister forgets a waiter's registration.
func (ln *listener) unregister(id string) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	delete(ln.regs, id)
}

// reregister makes every known registration again (they are idempotent),
// on the LISTEN connection: the pool is the callers'.
func (ln *listener) reregister(ctx context.Context, conn *pgx.Conn) error {
	ln.mu.Lock()
	regs := make(map[string]registration, len(ln.regs))
	for id, r := range ln.regs {
		regs[id] = r
	}
	ln.mu.Unlock()
	for _, r := range regs {
		if err := ln.c.q.LeaseWaitFor(ctx, conn, r); err != nil {
			return fmt.Errorf("leasetable: register waiters again: %w", err)
		}
	}
	return nil
}

// deferStop leaves the removal of a stopped waiter's registration to the
// LISTEN connection, and reports false when there is none to do it (not
// started, closed, or not delivering): then the caller removes it on the
// pool. The registration only makes releases of name notify until then,
// which wakes nobody. Measured with 200 clients on 2 cores, removing it on
// the pool beside the caller made every pool open a second connection
// (325-403 connections opened in a 10s run against 209 without LISTEN).
func (ln *listener) deferStop(name, id string) bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if !ln.started || ln.closed || ln.undelivered != nil || len(ln.stops) >= maxStops {
		return false
	}
	ln.stops = append(ln.stops, waiterRef{name: name, id: id})
	return true
}

// flushStops removes the registrations deferStop left, on conn. Those it
// could not remove stay for the next connection.
func (ln *listener) flushStops(ctx context.Context, conn *pgx.Conn) error {
	ln.mu.Lock()
	stops := ln.stops
	ln.stops = nil
	ln.mu.Unlock()
	for i, w := range stops {
		if err := ln.c.q.LeaseStopWaiting(ctx, conn, db.LeaseStopWaitingParams{Name: w.name, Waiter: w.id}); err != nil {
			ln.mu.Lock()
			ln.stops = append(stops[i:], ln.stops...)
			ln.mu.Unlock()
			return fmt.Errorf("leasetable: remove waiter registrations: %w", err)
		}
	}
	return nil
}

// takeStops returns the removals left undone when the listener ends for
// good, for the caller to make on the pool.
func (ln *listener) takeStops() []waiterRef {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	stops := ln.stops
	ln.stops = nil
	return stops
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
	// The empty payload names no lease: it wakes every waiter
	// (pgbaton.set_failover_grace ending a grace).
	ln.wake(n.Payload, n.Payload == "")
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
	if ln.undelivered != nil {
		ln.mu.Unlock()
		return fmt.Errorf("%w: %w; waiters poll every %s (set Config.ListenDSN to a direct connection)",
			pgbaton.ErrDegraded, ln.undelivered, ln.c.cfg.PollInterval)
	}
	if ln.idle {
		// Nobody waits: nothing listens, nothing to check (and a client
		// that found no listen slot free has no connection: !started).
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
