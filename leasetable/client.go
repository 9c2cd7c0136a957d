package leasetable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/telemetry"
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
	tel   *telemetry.Instruments // nil without a MeterProvider

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
		cfg.Logger.Error("pgbaton: leasetable refused a standby; connect to the primary")
		return nil, fmt.Errorf("%w: leasetable: the server is in recovery; connect to the primary", pgbaton.ErrStandby)
	}
	if err := migrations.Check(ctx, pool); err != nil && !errors.Is(err, pgbaton.ErrSchemaTooNew) {
		// A newer schema keeps the lease protocol compatible; an older one
		// may lack it.
		if errors.Is(err, pgbaton.ErrNotMigrated) {
			cfg.Logger.Error("pgbaton: leasetable refused an unmigrated database", "error", err)
		}
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	c := &Client{
		pool: pool, cfg: cfg, ttlMs: cfg.ttlMs(), q: q, log: cfg.Logger,
		bg: bg, bgCancel: cancel,
		leases: make(map[*Lease]struct{}),
		sems:   make(map[string]int),
	}
	// Room for a slash and 20 digits; cut on a character boundary.
	if cfg.MeterProvider != nil {
		c.tel = telemetry.New("lease", telemetry.Config{MeterProvider: cfg.MeterProvider, WithNames: cfg.MetricNames})
	}
	c.waiterPrefix = strings.ToValidUTF8(cfg.Owner[:min(len(cfg.Owner), MaxNameLen-21)], "") + "/"
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
// their TTL; their errors are returned, joined.
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
		errs = append(errs, c.dbError("remove waiter registrations", err))
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
	start := time.Now()
	l, err := c.attempt(ctx, name, nil, start)
	if err != nil {
		c.attemptFailed(ctx, name, err, start)
	}
	return l, err
}

// attempt tries once to take name. waitStart is when the caller began
// asking, for the wait-duration metric of a grant.
func (c *Client) attempt(ctx context.Context, name string, metadata []byte, waitStart time.Time) (*Lease, error) {
	// The local deadline counts from before the request is sent: the
	// database's expiry can only be later.
	start := time.Now()
	row, err := c.q.LeaseAttempt(ctx, c.pool, db.LeaseAttemptParams{
		Name: name, Owner: c.cfg.Owner, TtlMs: c.ttlMs, Metadata: metadata,
	})
	if err != nil {
		return nil, c.dbError("acquire "+name, err)
	}
	if !row.Acquired {
		return nil, &HeldError{Name: name, Holder: row.Holder, Token: row.Token, Expiry: row.ExpiresAt,
			remaining: row.ExpiresAt.Sub(row.DbNow)}
	}
	return c.track(name, "", row.Token, row.ExpiresAt, start, waitStart)
}

// track creates the Lease for a grant, records the granted attempt and
// starts keeping the lease alive.
func (c *Client) track(name, group string, token int64, expires, start, waitStart time.Time) (*Lease, error) {
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
	l.counted = true // before anything can end it: Close needs c.mu
	c.mu.Unlock()
	c.attempted(context.Background(), l.metricName(), telemetry.Acquired, waitStart)
	l.start()
	return l, nil
}

func (c *Client) untrack(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l)
	c.mu.Unlock()
}
