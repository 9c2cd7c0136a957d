package leasetable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/migrations"
)

// Client takes leases for one owner through a pool. It is safe for
// concurrent use. Close it to release its leases and its LISTEN connection.
type Client struct {
	pool  *pgxpool.Pool
	cfg   Config
	ttlMs int64
	q     *db.Queries
	log   *slog.Logger
	ln    *listener

	// bg parents renewals; cancelled by Close.
	bg       context.Context
	bgCancel context.CancelFunc

	// background counts goroutines Close must wait for.
	background sync.WaitGroup

	// waiterPrefix and waiterSeq make waiter ids in pgbaton.lease_waiter:
	// the owner (shortened to fit) and a slash, then a number.
	waiterPrefix string
	waiterSeq    atomic.Int64

	mu     sync.Mutex
	closed bool
	leases map[*Lease]struct{}
	sems   map[string]int // semaphores registered by this client: name -> slots
}

// New returns a client for the pgbaton schema behind pool. It refuses a
// pool that is nil, a database not migrated to this build's schema and a
// standby, and checks cfg (pgbaton.ErrInvalidArgument).
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, invalid("nil pool")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	q := db.New()
	info, err := q.ServerInfo(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("leasetable: connect: %w", err)
	}
	if info.InRecovery {
		return nil, pgbaton.ErrStandby
	}
	if err := migrations.Check(ctx, pool); err != nil && !errors.Is(err, pgbaton.ErrSchemaTooNew) {
		// A newer schema keeps the lease protocol compatible; an older one
		// may lack it.
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	c := &Client{
		pool: pool, cfg: cfg, ttlMs: cfg.ttlMs(), q: q, log: cfg.Logger,
		bg: bg, bgCancel: cancel,
		leases: make(map[*Lease]struct{}),
		sems:   make(map[string]int),
	}
	c.waiterPrefix = cfg.Owner[:min(len(cfg.Owner), MaxNameLen-21)] + "/"
	c.ln = newListener(c)
	return c, nil
}

// Owner is the owner string this client writes into the lease table.
func (c *Client) Owner() string { return c.cfg.Owner }

// Config is the client's configuration with defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// Close releases every lease the client still holds (their contexts end
// with ErrReleased), stops the LISTEN connection and makes further calls
// return pgbaton.ErrClosed. Releases that fail leave rows to expire at
// their TTL; the first such error is returned.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	held := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		held = append(held, l)
	}
	c.mu.Unlock()
	var errs []error
	for _, l := range held {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	c.ln.close()
	// Background work (releasing lost leases, removing waiter
	// registrations) is best effort; do not let it hold Close up.
	c.bgCancel()
	c.background.Wait()
	// Registrations whose removal was skipped because Close had begun.
	if err := c.q.LeaseStopWaitingAll(ctx, c.pool, c.waiterPrefix[:len(c.waiterPrefix)-1]); err != nil {
		errs = append(errs, dbError("remove waiter registrations", err))
	}
	return errors.Join(errs...)
}

// goBackground runs fn on its own goroutine, which Close waits for. After
// Close has begun it does nothing.
func (c *Client) goBackground(fn func(ctx context.Context)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.background.Add(1)
	go func() {
		defer c.background.Done()
		fn(c.bg)
	}()
}

func (c *Client) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return pgbaton.ErrClosed
	}
	return nil
}

// TryAcquire takes the lease name if nobody holds a live grant of it, in
// one round trip. When someone does, it returns a *HeldError (errors.Is
// ErrHeld) naming the holder and the grant's expiry.
func (c *Client) TryAcquire(ctx context.Context, name string) (*Lease, error) {
	if err := checkName("lease name", name); err != nil {
		return nil, err
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	return c.attempt(ctx, name, nil)
}

func (c *Client) attempt(ctx context.Context, name string, metadata []byte) (*Lease, error) {
	// The local deadline counts from before the request is sent: the
	// database's expiry can only be later.
	start := time.Now()
	row, err := c.q.LeaseAttempt(ctx, c.pool, db.LeaseAttemptParams{
		Name: name, Owner: c.cfg.Owner, TtlMs: c.ttlMs, Metadata: metadata,
	})
	if err != nil {
		return nil, dbError("acquire "+name, err)
	}
	if !row.Acquired {
		return nil, &HeldError{Name: name, Holder: row.Holder, Token: row.Token, Expiry: row.ExpiresAt,
			remaining: row.ExpiresAt.Sub(row.DbNow)}
	}
	return c.track(name, "", row.Token, row.ExpiresAt, start)
}

// Acquire takes the lease name, waiting while someone else holds it. It
// wakes when the holder releases (LISTEN/NOTIFY on the client's one
// listening connection) or at the holder's known expiry plus a little
// jitter; it never polls. It returns ctx's error when ctx ends first: the
// caller did not get the lease.
func (c *Client) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := checkName("lease name", name); err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, nil)
}

func (c *Client) acquire(ctx context.Context, name string, metadata []byte) (*Lease, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	l, err := c.attempt(ctx, name, metadata)
	var held *HeldError
	if !errors.As(err, &held) {
		return l, err // granted at once (the common case) or failed
	}
	w, err := c.startWaiting(ctx, name, false)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	for {
		// Look again after registering: a release before the registration
		// notified nobody.
		l, err := c.attempt(ctx, name, metadata)
		if !errors.As(err, &held) {
			return l, err
		}
		c.log.Debug("pgbaton: waiting for lease", "lease", name, "holder", held.Holder, "expires_in", held.remaining)
		if err := c.wait(ctx, w.wake, held.remaining); err != nil {
			return nil, fmt.Errorf("leasetable: waiting for lease %q (held by %q): %w", name, held.Holder, err)
		}
	}
}

// waiting is a registered waiter: subscribed to notifications for some
// lease names and recorded in pgbaton.lease_waiter, so releases notify.
type waiting struct {
	c           *Client
	name, id    string
	wake        <-chan struct{}
	unsubscribe func()
}

// startWaiting subscribes to notifications for name, then registers as a
// waiter for lease name, or for any lease of group name when group is set.
// The order matters: by the time a release can see the registration, the
// LISTEN is active.
func (c *Client) startWaiting(ctx context.Context, name string, group bool) (*waiting, error) {
	wake, unsubscribe, err := c.ln.subscribe(ctx, name)
	if err != nil {
		return nil, err
	}
	id := c.waiterPrefix + strconv.FormatInt(c.waiterSeq.Add(1), 10)
	if err := c.q.LeaseWaitFor(ctx, c.pool, db.LeaseWaitForParams{Name: name, Waiter: id, IsGroup: group}); err != nil {
		unsubscribe()
		return nil, dbError("register waiter for "+name, err)
	}
	return &waiting{c: c, name: name, id: id, wake: wake, unsubscribe: unsubscribe}, nil
}

// stop unsubscribes and removes the registration in the background: the
// waiter's id is unique, so no later registration can be removed by it.
func (w *waiting) stop() {
	w.unsubscribe()
	w.c.goBackground(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, w.c.cfg.TTL)
		defer cancel()
		if err := w.c.q.LeaseStopWaiting(ctx, w.c.pool, db.LeaseStopWaitingParams{Name: w.name, Waiter: w.id}); err != nil {
			w.c.log.Debug("pgbaton: removing waiter registration failed", "lease", w.name, "error", err)
		}
	})
}

// wait blocks until a wake-up, until the known expiry (d from now) plus
// jitter, or until ctx or the client ends.
func (c *Client) wait(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(max(d, 0) + jitter(c.cfg.TTL))
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.bg.Done():
		return pgbaton.ErrClosed
	}
}

// jitter spreads waiters that look again at the same expiry: up to 1% of
// the TTL, at least 1ms and at most 20ms.
func jitter(ttl time.Duration) time.Duration {
	hi := min(max(ttl/100, time.Millisecond), 20*time.Millisecond)
	return time.Millisecond + rand.N(hi)
}

// track creates the Lease for a grant and starts keeping it alive.
func (c *Client) track(name, group string, token int64, expires time.Time, start time.Time) (*Lease, error) {
	l := newLease(c, name, group, token, expires, start)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		// Closed while the grant was in flight: give it back at once.
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.TTL)
		defer cancel()
		_ = l.Release(ctx)
		return nil, pgbaton.ErrClosed
	}
	c.leases[l] = struct{}{}
	c.mu.Unlock()
	l.start()
	return l, nil
}

func (c *Client) untrack(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l)
	c.mu.Unlock()
}

// Info reads the row of lease name, for diagnostics: who holds it, until
// when and with which token. A name never used gives a zero Info.
func (c *Client) Info(ctx context.Context, name string) (Info, error) {
	if err := checkName("lease name", name); err != nil {
		return Info{}, err
	}
	row, err := c.q.LeaseGet(ctx, c.pool, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Info{Name: name}, nil
	}
	if err != nil {
		return Info{}, dbError("read lease "+name, err)
	}
	in := Info{Name: row.Name, Group: row.LeaseGroup.String, Owner: row.Owner.String, Token: row.Token.Int64,
		Metadata: row.Metadata}
	if row.ExpiresAt != nil {
		in.ExpiresAt = *row.ExpiresAt
		in.Held = row.Owner.Valid && row.ExpiresAt.After(row.DbNow)
		in.Remaining = row.ExpiresAt.Sub(row.DbNow)
	}
	return in, nil
}

// Info is a lease row as Client.Info read it.
type Info struct {
	Name      string
	Group     string
	Held      bool          // a live grant exists
	Owner     string        // owner of the last grant if not released
	Token     int64         // last token granted (0: never granted)
	ExpiresAt time.Time     // database clock; zero when released
	Remaining time.Duration // ExpiresAt minus the database clock at the read
	Metadata  []byte
}
