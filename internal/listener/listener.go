// Package listener holds a lease client's one LISTEN connection, shared by
// its waiters: it wakes a waiter whose turn came (pgbaton.notify_waiters
// sends the waiter's id), makes the waiters' registrations again on a new
// connection, and removes the registrations of waiters that left. When it
// listens is leasetable's contract (its package doc, "Waiting"); its
// errors reach users through leasetable and say so. A Waiter (Join) is
// one waiter's side of it: subscribed, then paced between its looks.
// Settings checks the client's settings of it.
//
// Its state has one owner, the client's keeper goroutine (Config.Owner):
// subscribers and the connection's goroutine read and change it in
// messages, so that no lock orders it against anything.
package listener

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/appname"
	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/serverkind"
)

// Owner runs the listener's messages on the goroutine that owns its
// state: Post queues f, Ask runs f and waits for it, Spawn runs f on a
// goroutine of its own that the client's Close waits for. Each reports
// false, and runs nothing, once the client closed.
type Owner interface {
	Post(f func()) bool
	Ask(f func()) bool
	Spawn(f func()) bool
}

// Config is what the listener needs of its client.
type Config struct {
	Owner   Owner
	Context context.Context // the client's: ends when it closes
	Pool    *pgxpool.Pool   // the client's pool, whose settings the connection copies
	Queries *db.Queries
	Log     *slog.Logger
	// Client is the client's owner, in the connection's application_name;
	// the five below are the client's Config fields of the same names.
	Client            string
	ListenDSN         string
	ListenSlots       int
	NoListen          bool
	PollInterval, TTL time.Duration

	// CheckOpen returns ErrClosed once the client closed.
	CheckOpen func() error
	// DBError is the client's error for a failed statement op.
	DBError func(op string, err error) error
	// NewID returns a payload of kind that no waiter or probe used.
	NewID func(kind string) string
	// SlotFree asks the server whether a listen slot is free, on the pool,
	// returning when ctx ends although the statement runs on.
	SlotFree func(ctx context.Context) (bool, error)
}

// notifyChannel is the channel pgbaton.notify_waiters notifies, with the
// waiter's id as payload.
const notifyChannel = "pgbaton_lease"

// Listener holds the client's one LISTEN connection. A waiter starts its
// goroutine (run) when a listen slot is free; it ends when the client
// closes, when every slot turns out taken, or after SlotKeep without
// waiters.
type Listener struct {
	cfg Config
	// keep, grace, reprove, readyWait, stopped, opened and retry are
	// SlotKeep, CloseGrace, UndeliveredRetry, ReadyWait, Stopped, Opened
	// and Retry as they were when the client was made.
	keep, grace, reprove, readyWait time.Duration
	stopped, opened                 func()
	retry                           backoff.Backoff
	// kick asks run to reconnect now rather than after its backoff, or an
	// idle connection to listen again: a waiter needs it (buffered, 1).
	kick      chan struct{}
	saidTaken sync.Once

	// Owned by the Owner's goroutine: read and changed in do.
	waiters map[string]chan struct{} // wake-up channels, by waiter id
	// regs are the waiters' registrations (pgbaton.lease_waiter), made
	// again by a new connection: that table is unlogged, and a crash or a
	// failover empties it. remade counts how often one did (reregister).
	regs    map[string]listenReg
	remade  int64
	leaving []waiterRef              // registrations to remove (Leave)
	probes  map[string]chan struct{} // Check payloads in flight
	ready   chan struct{}            // closed while LISTEN is active
	// started: run is running; idle: its connection does not listen as
	// nobody waits (pause); connected: a new connection may have missed
	// releases and registrations.
	started, idle, connected bool
	// undelivered is why waiters poll although the client listens: the
	// last connection delivered no notification in time (a transaction
	// pooler, or a link or server slow then), found at undeliveredAt.
	undelivered   error
	undeliveredAt time.Time
	lastErr       error     // why the last connection failed
	down          time.Time // since when no connection listens (zero while one does)
	quietSince    time.Time // since when nobody has waited
	slotTried     time.Time // when the client last asked for a slot (slotFree)
	stop          context.CancelFunc
	done          chan struct{}
}

// Retry paces the LISTEN connection's reconnections, unless a waiter
// kicks it. Capped low: while the connection is down, releases wake
// nobody.
var Retry = backoff.Backoff{Min: 10 * time.Millisecond, Max: 250 * time.Millisecond} // a var for tests: read once per client

// UndeliveredRetry is how long after a LISTEN connection was found not to
// deliver the next wait proves a new one.
var UndeliveredRetry = time.Minute // a var for tests: read once per client

// slotRetry is how often a client without a listen slot asks again for
// one, at most (when a waiter arrives).
const slotRetry = time.Second

// SlotKeep is how long a client keeps its listen slot, and the connection
// that holds it, after its last waiter left (not listening meanwhile: see
// listenLinger), so a slot serves waits that follow each other without a
// backend start per wait (200 clients on 2 cores that opened and closed
// LISTEN connections as they waited: acquire p99 0.8 to 2.6 s against
// 0.13 s without LISTEN).
var SlotKeep = 30 * time.Second // a var for tests: read once per client

// errNoSlot, errIdle and errUndelivered end the listener on purpose: every
// listen slot was taken, nobody waited for SlotKeep, or notifications are
// not delivered.
var (
	errNoSlot      = errors.New("leasetable: every listen slot is taken")
	errIdle        = errors.New("leasetable: nobody waits")
	errUndelivered = errors.New("leasetable: notifications sent on the LISTEN connection's channel were not delivered")
)

// Settings fills in the defaults of a client's settings of the same names,
// pollInterval (1s) and listenSlots (16), and says what is wrong with
// them, or "".
func Settings(pollInterval *time.Duration, listenSlots *int, noListen bool, listenDSN string) string {
	if *pollInterval == 0 {
		*pollInterval = time.Second
	}
	if *pollInterval < 0 {
		return fmt.Sprintf("PollInterval must be positive, got %s", *pollInterval)
	}
	if *listenSlots == 0 {
		*listenSlots = 16
	}
	if *listenSlots < 0 || *listenSlots > 10000 {
		return fmt.Sprintf("ListenSlots must be 1 to 10000, got %d", *listenSlots)
	}
	if noListen && listenDSN != "" {
		return "NoListen and ListenDSN exclude each other"
	}
	if listenDSN != "" {
		if _, err := pgx.ParseConfig(listenDSN); err != nil {
			return fmt.Sprintf("ListenDSN: %v", err)
		}
	}
	return ""
}

// Registration is one row of pgbaton.lease_waiter.
type Registration = db.LeaseWaitForParams

// listenReg is a registration the listener makes again on a new
// connection, and remade as it was when it was recorded (granted).
type listenReg struct {
	r  Registration
	at int64
}

// waiterRef names one row of pgbaton.lease_waiter.
type waiterRef struct{ name, id string }

// New returns the listener of a client; it connects when a waiter first
// subscribes.
func New(cfg Config) *Listener {
	return &Listener{cfg: cfg, keep: SlotKeep, grace: CloseGrace, reprove: UndeliveredRetry, readyWait: ReadyWait, stopped: Stopped, opened: Opened, retry: Retry, kick: make(chan struct{}, 1),
		waiters: map[string]chan struct{}{}, regs: map[string]listenReg{}, probes: map[string]chan struct{}{}, ready: make(chan struct{})}
}

// State reports, for tests, whether the connection's goroutine runs,
// whether its connection is paused (idle), and how many wake-up channels
// are subscribed.
func (ln *Listener) State() (started, idle bool, waiters int) {
	ln.do(func() { started, idle, waiters = ln.started, ln.started && ln.idle, len(ln.waiters) })
	return started, idle, waiters
}

// Mode is how a subscribed waiter learns of releases.
type Mode int

const (
	// Listening: the LISTEN connection is active, so no release after
	// Join returned can be missed once the waiter is registered.
	Listening Mode = iota
	// Polling: every PollInterval, by configuration (NoListen) or because
	// the connection does not deliver (a transaction pooler).
	Polling
	// PollingBackoff: from a short first wait, doubling up to PollInterval: the
	// client holds no listen slot, or its connection was not up within
	// ReadyWait.
	PollingBackoff
)

// ReadyWait is how long a waiter waits for the LISTEN connection to come
// up before it polls instead: a server slow to accept connections must
// not fail waits that polling would serve (200 clients on 2 cores: waits
// failed "waiting for the LISTEN connection" after 5 s).
var ReadyWait = 250 * time.Millisecond // a var for tests: read once per client

// subscribe has notifications to waiter id signal wake (buffered, 1) until
// unregister, and returns once the connection listens, so no release
// after it can be missed, or once it is clear the waiter must poll.
func (ln *Listener) subscribe(ctx context.Context, id string, wake chan struct{}) (Mode, error) {
	if ln.cfg.NoListen {
		return Polling, ln.cfg.CheckOpen()
	}
	var started, degraded bool
	if !ln.do(func() {
		ln.waiters[id], started, degraded = wake, ln.started, ln.undelivered != nil
		if degraded && !started && time.Since(ln.undeliveredAt) >= ln.reprove {
			// Prove a new connection meanwhile: one late probe must not
			// leave the client polling for good.
			ln.start()
		}
	}) {
		return 0, pgbaton.ErrClosed
	}
	if degraded {
		return Polling, nil
	}
	if !started && !ln.slotFree(ctx) {
		return PollingBackoff, nil
	}
	var ready chan struct{}
	if !ln.do(func() {
		if !ln.started {
			ln.start()
		}
		ready = ln.ready
	}) {
		return 0, pgbaton.ErrClosed
	}
	select {
	case <-ready:
		return ln.mode(), nil
	default:
		ln.kickRun()
	}
	select {
	case <-ready:
		return ln.mode(), nil
	case <-time.After(ln.readyWait):
		return PollingBackoff, nil
	case <-ctx.Done():
		ln.unregister(id)
		return 0, fmt.Errorf("leasetable: waiting for the LISTEN connection: %w", context.Cause(ctx))
	case <-ln.cfg.Context.Done():
		ln.unregister(id)
		return 0, pgbaton.ErrClosed
	}
}

// start starts run; on the Owner's goroutine.
func (ln *Listener) start() {
	ln.started = true
	select {
	case <-ln.ready: // left closed by a connection that did not deliver
		ln.ready = make(chan struct{})
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln.stop, ln.done = cancel, make(chan struct{})
	go ln.run(ctx)
}

// kickRun asks run to reconnect now, or a paused connection to listen
// again.
func (ln *Listener) kickRun() {
	select {
	case ln.kick <- struct{}{}:
	default: // already kicked
	}
}

// polls reports whether waiters poll rather than wait for notifications
// now (see mode).
func (ln *Listener) polls() bool { return ln.mode() != Listening }

// mode is how a waiter subscribing now learns of releases. A connection
// not listening now (connecting, reconnecting, idle) counts as polling, so
// a subscriber that saw it ready just before does not count on it.
func (ln *Listener) mode() Mode {
	if ln.cfg.NoListen {
		return Polling
	}
	m := PollingBackoff // also once the client closed
	ln.do(func() {
		switch {
		case ln.undelivered != nil:
			m = Polling
		case !ln.started:
			// no listen slot was free
		default:
			select {
			case <-ln.ready:
				m = Listening
			default:
			}
		}
	})
	return m
}

// do runs f on the Owner's goroutine, which owns the listener's state,
// and waits for it; false once the client closed.
func (ln *Listener) do(f func()) bool { return ln.cfg.Owner.Ask(f) }

// wake signals waiter id, or every waiter when all is set, from the
// keeper's goroutine.
func (ln *Listener) wake(id string, all bool) {
	ln.cfg.Owner.Post(func() { ln.signal(id, all) })
}

// signal is wake on the Owner's goroutine.
func (ln *Listener) signal(id string, all bool) {
	signal := func(ch chan struct{}) {
		select {
		case ch <- struct{}{}:
		default: // already signalled
		}
	}
	if !all {
		if ch, ok := ln.waiters[id]; ok {
			signal(ch)
		}
		return
	}
	for _, ch := range ln.waiters {
		signal(ch)
	}
}

// setReady closes ready unless it is closed; on the Owner's goroutine.
func (ln *Listener) setReady() {
	select {
	case <-ln.ready:
	default:
		close(ln.ready)
	}
}

func (ln *Listener) run(ctx context.Context) {
	defer close(ln.done)
	// Ended for good: leave queues no more for a connection (started,
	// closed or undelivered says so), and the pool removes what is left.
	defer ln.drain()
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	defer context.AfterFunc(ctx, func() {
		if ln.stopped != nil {
			ln.stopped()
		}
		time.AfterFunc(ln.grace, qcancel)
	})()
	retry := ln.retry
	for ctx.Err() == nil {
		err := ln.listen(ctx, qctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoSlot) || errors.Is(err, errIdle) || errors.Is(err, errUndelivered) {
			var first bool
			ln.do(func() { first = ln.ended(err) })
			switch {
			case errors.Is(err, errUndelivered) && first:
				ln.cfg.Log.Warn("pgbaton: notifications are not delivered on the lease LISTEN connection (a transaction pooler such as PgBouncer in transaction mode, or a slow link or server?); waiters poll at the holder's expiry, at most every PollInterval, and a wait proves a new connection every reprove_in. Set Config.ListenDSN to a direct connection to wake them at once.",
					"poll_interval", ln.cfg.PollInterval, "reprove_in", ln.reprove)
			case errors.Is(err, errNoSlot):
				ln.slotsTaken()
			}
			ln.wake("", true) // waiters that counted on it poll from now on
			return
		}
		var wasUp bool
		ln.do(func() {
			ln.lastErr = err
			if wasUp = ln.down.IsZero(); wasUp {
				ln.down = time.Now()
			}
		})
		if wasUp {
			// A connection that was up (or the first try) starts the
			// backoff over: an outage long ago must not slow this one.
			retry.Reset()
		}
		// What the connection left is removed on the pool: one down for
		// long must not hold back the turns of the queues those waiters
		// left. The next connection makes again only the registrations of
		// waiters still here (regs), so none removed now comes back.
		ln.drain()
		d := retry.Next()
		ln.cfg.Log.Warn("pgbaton: lease LISTEN connection failed; reconnecting", "error", err, "in", d)
		select {
		case <-time.After(d):
		case <-ln.kick:
			// A waiter needs the connection, and its look at the lease
			// just reached the server: reconnect now.
		case <-ctx.Done():
			return
		}
	}
}

// ended notes that the listener ended on purpose (errNoSlot, errIdle,
// errUndelivered), and reports whether err newly found notifications
// undelivered; on the Owner's goroutine.
func (ln *Listener) ended(err error) (first bool) {
	ln.setReady() // subscribers waiting for it poll
	ln.started, ln.down, ln.lastErr = false, time.Time{}, nil
	if ln.undelivered != nil {
		// A connection that was to prove delivery ended unproved (no
		// slot, say): the next try is ln.reprove from now, not at every
		// wait.
		ln.undeliveredAt = time.Now()
	}
	// The next connection makes the registrations again.
	ln.connected = len(ln.regs) > 0
	switch {
	case errors.Is(err, errUndelivered):
		// Waiters poll until a wait ln.reprove later proves a new
		// connection (subscribe); ready stays closed so that none waits
		// for one meanwhile.
		first = ln.undelivered == nil
		ln.undelivered, ln.undeliveredAt = err, time.Now()
		return first
	case errors.Is(err, errNoSlot):
		ln.slotTried = time.Now()
	}
	ln.ready = make(chan struct{})
	return false
}

// slotsTaken logs, once per client, that it found every listen slot taken:
// by design in a fleet larger than Config.ListenSlots, else the sign of a
// session outside pgbaton holding the slots' advisory keys.
func (ln *Listener) slotsTaken() {
	ln.saidTaken.Do(func() {
		ln.cfg.Log.Info("pgbaton: every listen slot is taken; this client's waiters poll (from 50ms up to PollInterval) until one is free. Expected when more clients than ListenSlots wait at once; otherwise see who holds the advisory keys (1885495924, 0..ListenSlots-1): SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885495924",
			"listen_slots", ln.cfg.ListenSlots, "poll_interval", ln.cfg.PollInterval)
	})
}

// slotFree reports whether a listen slot is free, asked on the pool (the
// waiter is about to wait, so this takes no second pool connection) at
// most once a slotRetry. An error counts as no: the waiter polls, and its
// own looks meet the error.
func (ln *Listener) slotFree(ctx context.Context) bool {
	try := false
	ln.do(func() {
		if try = time.Since(ln.slotTried) >= slotRetry; try {
			ln.slotTried = time.Now() // the client's other waiters poll meanwhile
		}
	})
	if !try {
		return false
	}
	free, err := ln.cfg.SlotFree(ctx)
	if err == nil && !free {
		ln.slotsTaken()
	}
	return err == nil && free
}

// CloseGrace is how long a statement on the LISTEN connection may go on
// once the client closes. Cancelling it would close the connection (pgx),
// and a backend frees its listen slot only once it has finished exiting,
// after Close returned (CI saw the slot still in pg_locks). So a closing
// listener lets the statement in flight finish and frees the slot itself;
// a server that stopped answering holds Close up to twice this.
var CloseGrace = time.Second // a var for tests: read once per client

// Stopped, if set (tests), is called when a listener is told to
// stop, before its CloseGrace starts. Read once per client.
var Stopped func()

// Opened, if set (tests), is called when a LISTEN connection has been
// opened, before its first statement. Read once per client.
var Opened func()

// listen runs one connection until it fails or ctx ends. Statements on it
// run under qctx, which ends a CloseGrace after ctx; waits end with ctx.
func (ln *Listener) listen(ctx, qctx context.Context) error {
	conn, err := ln.connect(ctx)
	if err != nil {
		return err
	}
	// Nothing to stop on a connection that found no slot: it did not
	// LISTEN and holds none.
	listened := false
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), ln.grace)
		defer cancel()
		if listened && !conn.IsClosed() {
			// The slot is freed before Close returns (see CloseGrace).
			_ = ln.cfg.Queries.LeaseListenStop(closeCtx, conn)
		}
		_ = conn.Close(closeCtx)
	}()
	if ln.opened != nil {
		ln.opened()
	}
	if err := ln.slotStillFree(qctx, conn); err != nil {
		return err
	}
	listened = true
	if err := ln.cfg.Queries.LeaseListen(qctx, conn); err != nil {
		return err
	}
	// Prove that it delivers: behind a transaction pooler LISTEN succeeds
	// but its notifications go to whoever uses the server connection next.
	if err := ln.probe(ctx, conn); err != nil {
		return err
	}
	if err := ln.takeSlot(qctx, conn); err != nil {
		return err
	}
	var missed bool
	ln.do(func() { missed = ln.connected })
	if missed {
		// The server may have lost the registrations (a crash, a
		// failover): make them again, now that LISTEN is active.
		if err := ln.reregister(qctx, conn); err != nil {
			return err
		}
	}
	var wasDown, proved bool
	var downFor time.Duration
	ln.do(func() {
		close(ln.ready)
		ln.connected = true
		wasDown, downFor = !ln.down.IsZero(), time.Since(ln.down)
		ln.down = time.Time{}
		proved, ln.undelivered = ln.undelivered != nil, nil
	})
	if proved {
		ln.cfg.Log.Info("pgbaton: notifications are delivered on the lease LISTEN connection again; waiters wake at once")
	}
	if missed {
		if wasDown {
			ln.cfg.Log.Info("pgbaton: lease LISTEN connection re-established; waiters look again", "down_for", downFor)
		}
		ln.wake("", true) // releases meanwhile were missed
	}
	defer ln.do(func() {
		select {
		case <-ln.ready:
			ln.ready = make(chan struct{})
		default: // not ready already (paused): its subscribers keep it
		}
		ln.idle = false
	})
	for {
		if err := ln.flush(qctx, conn); err != nil {
			return err
		}
		// A deadline, not a cancel request: pgconn keeps the connection
		// open on a timeout.
		wctx, cancel := context.WithTimeout(ctx, listenLinger)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			ln.dispatch(n)
		case ctx.Err() != nil || !pgconn.Timeout(err) || conn.IsClosed():
			return err
		case ln.quiet():
			if err := ln.pause(ctx, qctx, conn); err != nil {
				return err
			}
		}
	}
}

// listenLinger is how long the LISTEN connection keeps listening after its
// last waiter left. Every NOTIFY signals every listening backend, on any
// channel: a fleet whose clients all listened all the time spent the
// server's CPU on deliveries nobody waited for (200 clients: acquire p50
// 578 ms against 3 ms without LISTEN).
const listenLinger = 100 * time.Millisecond

// quiet reports whether nobody has waited for listenLinger, and if so
// stops counting the connection as listening, before the UNLISTEN, so
// that no waiter counts on a connection that stops.
func (ln *Listener) quiet() (quiet bool) {
	ln.do(func() {
		switch {
		case len(ln.waiters) > 0 || len(ln.probes) > 0:
			ln.quietSince = time.Time{}
			return
		case ln.quietSince.IsZero():
			ln.quietSince = time.Now()
		}
		if quiet = time.Since(ln.quietSince) >= listenLinger; quiet {
			ln.ready = make(chan struct{})
			ln.idle, ln.quietSince = true, time.Time{}
		}
	})
	return quiet
}

// pause stops listening but keeps the slot, until a waiter subscribes
// (listen again) or for SlotKeep (errIdle: listen's end frees the slot).
func (ln *Listener) pause(ctx, qctx context.Context, conn *pgx.Conn) error {
	// Removals queued before it went idle; later ones go on the pool.
	if err := ln.flush(qctx, conn); err != nil {
		return err
	}
	if err := ln.cfg.Queries.LeaseUnlisten(qctx, conn); err != nil {
		return err
	}
	select {
	case <-ln.kick:
	case <-time.After(ln.keep):
		return errIdle
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := ln.takeSlot(qctx, conn); err != nil {
		// The kick was a waiter's: a connection that broke while paused
		// (an outage nobody read) is made again at once, not after
		// run's backoff.
		ln.kickRun()
		return err
	}
	ln.do(func() {
		ln.idle = false
		ln.setReady()
	})
	return nil
}

// slotStillFree asks again on the new connection conn whether a listen
// slot is free (errNoSlot if not), before it LISTENs and sends its probe.
// The clients of a fleet that found a slot free on their pools at about
// the same time all open a connection, and only one gets the slot: the
// others used to LISTEN, send a probe (a NOTIFY, which signals every
// listening backend of the database) and try for the slot before they
// gave up (500 clients, 16 slots: 316 connections took a slot or tried,
// 286 probes, in one 25 s run). The slot itself is taken after the
// probe, so that one is never taken through a transaction pooler.
func (ln *Listener) slotStillFree(ctx context.Context, conn *pgx.Conn) error {
	free, err := ln.cfg.Queries.LeaseListenSlotFree(ctx, conn, int32(ln.cfg.ListenSlots))
	if err == nil && !free {
		err = errNoSlot
	}
	return err
}

// takeSlot takes a listen slot, or keeps the one conn holds, and listens;
// errNoSlot when every slot is taken.
func (ln *Listener) takeSlot(ctx context.Context, conn *pgx.Conn) error {
	listening, err := ln.cfg.Queries.LeaseListenStart(ctx, conn, int32(ln.cfg.ListenSlots))
	if err == nil && !listening {
		err = errNoSlot
	}
	return err
}

// connect opens the LISTEN connection, named in application_name: to
// Config.ListenDSN, or with the pool's settings and its BeforeConnect and
// AfterConnect hooks (credentials made per connection work). Not a pooled
// connection: the pool keeps its warm backends instead of replacing one
// with a cold one (100 clients waiting at once: 197 acquires/s against 556
// without LISTEN), nobody else uses it, and pool lifetime limits do not
// close it.
func (ln *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	var cfg *pgx.ConnConfig
	var after func(context.Context, *pgx.Conn) error
	if dsn := ln.cfg.ListenDSN; dsn != "" {
		var err error
		if cfg, err = pgx.ParseConfig(dsn); err != nil {
			return nil, err
		}
		after = serverkind.CheckConn
	} else {
		pcfg := ln.cfg.Pool.Config() // a copy, ConnConfig included
		cfg, after = pcfg.ConnConfig, pcfg.AfterConnect
		if pcfg.BeforeConnect != nil {
			if err := pcfg.BeforeConnect(ctx, cfg); err != nil {
				return nil, err
			}
		}
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = make(map[string]string)
		}
	}
	cfg.RuntimeParams["application_name"] = appname.Of("lease listener", ln.cfg.Client)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if after != nil {
		if err := after(ctx, conn); err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}

// probe sends a notification through the pool and waits for conn to
// deliver it; errUndelivered if it does not in time.
func (ln *Listener) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := ln.cfg.NewID("probe/")
	if err := ln.cfg.Queries.LeaseNotify(ctx, ln.cfg.Pool, payload); err != nil {
		return err
	}
	// On a working connection it comes back in a round trip.
	pctx, cancel := context.WithTimeout(ctx, min(max(ln.cfg.TTL/10, 250*time.Millisecond), time.Second))
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

// Register records a waiter's registration, to be made again on a new
// connection.
func (ln *Listener) Register(id string, r Registration) {
	ln.cfg.Owner.Post(func() { ln.regs[id] = listenReg{r, ln.remade} })
}

// unregister forgets waiter id: its wake-up channel and its registration.
func (ln *Listener) unregister(id string) { ln.cfg.Owner.Post(func() { ln.forget(id) }) }

// forget is unregister on the Owner's goroutine.
func (ln *Listener) forget(id string) {
	delete(ln.waiters, id)
	delete(ln.regs, id)
}

// reregister makes every known registration again (they are idempotent),
// on the LISTEN connection: the pool is the callers'.
func (ln *Listener) reregister(ctx context.Context, conn *pgx.Conn) error {
	var regs []Registration
	ln.do(func() {
		ln.remade++
		for _, lr := range ln.regs {
			regs = append(regs, lr.r)
		}
	})
	for _, r := range regs {
		if err := ln.cfg.Queries.LeaseWaitFor(ctx, conn, r); err != nil {
			return fmt.Errorf("leasetable: register waiters again: %w", err)
		}
	}
	return nil
}

// Leave forgets waiter id, like unregister, and has its registration
// removed, the one way one is (but for Close's sweep), off the caller's
// goroutine: by the LISTEN connection while it runs (within listenLinger),
// else on the pool in the background. On the pool, it ran beside the
// granted caller's next call and made the pool open a second connection
// (200 clients on 2 cores: 325-403 connections opened in 10 s against 209
// without LISTEN). stop_waiting hands the waiter's turn on (queue_lock
// orders it with wake-ups in flight).
func (ln *Listener) Leave(name, id string) {
	// Not posted once the client closed: its sweep removes it.
	ln.cfg.Owner.Post(func() { ln.queueLeave(name, id) })
}

// removed forgets waiter id, whose registration a statement of its wait
// removed (its grant, in the grant's transaction, or Waiter.LeaveNow): no
// statement is sent (one per contended Acquire woken by NOTIFY, deleting
// nothing), unless a new connection made the registrations again since it
// was recorded (reregister), which may have come after the removal.
func (ln *Listener) removed(name, id string) {
	ln.cfg.Owner.Post(func() {
		if lr, ok := ln.regs[id]; ok && lr.at != ln.remade {
			ln.queueLeave(name, id)
			return
		}
		ln.forget(id)
	})
}

// queueLeave is Leave on the Owner's goroutine.
func (ln *Listener) queueLeave(name, id string) {
	ln.forget(id)
	ln.leaving = append(ln.leaving, waiterRef{name: name, id: id})
	// run flushes the queue on each turn of its loop, and hands it to the
	// pool whenever a connection ends.
	if !ln.started || ln.idle || ln.undelivered != nil {
		ln.drain()
	}
}

// RetryLeaving removes, after a keep-alive succeeded, the registrations
// whose removal failed: left queued until the client's next wait, a
// registration of a wait given up kept its place at the head of the queue
// as long as the client's session lived, and the lease was refused to
// everyone behind it. On the Owner's goroutine.
func (ln *Listener) RetryLeaving() {
	if len(ln.leaving) > 0 {
		ln.drain()
	}
}

// drain removes the queued registrations on the pool, in the background.
// What fails stays queued for the next Leave, connection or keep-alive
// (RetryLeaving); Close's sweep removes what is left.
func (ln *Listener) drain() {
	ln.cfg.Owner.Spawn(func() {
		ctx, cancel := context.WithTimeout(ln.cfg.Context, ln.cfg.TTL)
		defer cancel()
		if err := ln.flush(ctx, ln.cfg.Pool); err != nil {
			ln.cfg.Log.Debug("pgbaton: removing waiter registrations failed", "error", err)
		}
	})
}

// flush removes the queued registrations on conn (the LISTEN connection
// or the pool); those it could not remove stay queued.
func (ln *Listener) flush(ctx context.Context, conn db.DBTX) error {
	var refs []waiterRef
	ln.do(func() { refs, ln.leaving = ln.leaving, nil })
	for i, w := range refs {
		if err := ln.stopWaiting(ctx, conn, w.name, w.id); err != nil {
			ln.do(func() { ln.leaving = append(refs[i:], ln.leaving...) })
			return fmt.Errorf("leasetable: remove waiter registrations: %w", err)
		}
	}
	return nil
}

// stopWaiting removes waiter id's registration in the queue of name.
func (ln *Listener) stopWaiting(ctx context.Context, conn db.DBTX, name, id string) error {
	return ln.cfg.Queries.LeaseStopWaiting(ctx, conn, db.LeaseStopWaitingParams{Name: name, Waiter: id})
}

func (ln *Listener) dispatch(n *pgconn.Notification) {
	if n.Channel != notifyChannel {
		return
	}
	ln.cfg.Owner.Post(func() {
		if ch, ok := ln.probes[n.Payload]; ok {
			close(ch)
			delete(ln.probes, n.Payload)
		}
		// The empty payload (pgbaton.set_failover_grace ending a grace)
		// wakes every waiter.
		ln.signal(n.Payload, n.Payload == "")
	})
}

// Check proves the LISTEN connection, if started, delivers: it sends
// payload through the pool and waits for it to come back. A connection can
// look open and deliver nothing (a silent network, a stuck backend).
func (ln *Listener) Check(ctx context.Context, payload string) error {
	var got chan struct{}
	var err error
	ln.do(func() {
		switch {
		case ln.undelivered != nil:
			err = fmt.Errorf("%w: %w; waiters poll every %s (set Config.ListenDSN to a direct connection)",
				pgbaton.ErrDegraded, ln.undelivered, ln.cfg.PollInterval)
		case !ln.started || ln.idle:
			// Nothing listens, nothing to check.
		default:
			select {
			case <-ln.ready:
				got = make(chan struct{})
				ln.probes[payload] = got
			default:
				err = errors.New("leasetable: LISTEN connection not connected yet")
				if !ln.down.IsZero() {
					err = fmt.Errorf("leasetable: LISTEN connection down for %s, reconnecting (last error: %v); waiters wake only at expiries",
						time.Since(ln.down).Round(time.Millisecond), ln.lastErr)
				}
			}
		}
	})
	if got == nil {
		return err
	}
	defer ln.do(func() { delete(ln.probes, payload) })
	if err := ln.cfg.Queries.LeaseNotify(ctx, ln.cfg.Pool, payload); err != nil {
		return ln.cfg.DBError("notify for the LISTEN check", err)
	}
	select {
	case <-got:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leasetable: LISTEN connection did not deliver a notification in time: %w", context.Cause(ctx))
	}
}

// Close stops run, once the Owner has stopped (the client's Close): what it
// set is read without asking.
func (ln *Listener) Close() {
	if ln.stop != nil {
		ln.stop()
		<-ln.done
	}
}
