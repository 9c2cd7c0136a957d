package leasetable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/combine"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/internal/replication"
	"github.com/pgbaton/pgbaton/internal/schema"
	"github.com/pgbaton/pgbaton/internal/serverkind"
	"github.com/pgbaton/pgbaton/internal/session"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// Client takes leases for one owner through a pool. It is safe for
// concurrent use. Close it to release its leases and its LISTEN connection.
type Client struct {
	pool  *pgxpool.Pool
	cfg   Config
	ttlMs int64
	q     *db.Queries
	sdb   session.DB // the lease sessions' statements
	log   *slog.Logger
	ln    *listener.Listener
	tel   *telemetry.Instruments // nil without a MeterProvider
	tr    telemetry.Tracer
	repl  replication.Log

	bg         context.Context // parents background work; cancelled by Close
	bgCancel   context.CancelFunc
	background sync.WaitGroup // goroutines Close waits for

	// waiterPrefix and waiterSeq make waiter ids: the owner (shortened to
	// fit), a slash, a number.
	waiterPrefix string
	waiterSeq    atomic.Int64

	k    *keeper                            // the session, the leases, what to give back
	cc   combine.Sender[*keeper, *combined] // sends CompleteAndClaim calls together (combine.go)
	sems sync.Map                           // semaphores checked: name -> slots
	// sessionTaken is the test hook of that name, read once per client.
	sessionTaken func()
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
	// Servers that speak the protocol but not its semantics (YugabyteDB's
	// per-connection sequence caches break growing tokens).
	if err := serverkind.Check(ctx, pool); err != nil {
		if errors.Is(err, pgbaton.ErrUnsupportedServer) {
			cfg.Logger.Error("pgbaton: leasetable refused the server", "error", err)
		}
		return nil, err
	}
	q := db.New()
	info, err := q.ServerInfo(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("leasetable: connect: %w", err)
	}
	if info.InRecovery {
		cfg.Logger.Error("pgbaton: leasetable refused a standby; connect to the primary")
		return nil, fmt.Errorf("%w: the server is in recovery; connect to the primary", pgbaton.ErrStandby)
	}
	if err := schema.Check(ctx, pool); err != nil && !errors.Is(err, pgbaton.ErrSchemaTooNew) {
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
		bg: bg, bgCancel: cancel, tr: telemetry.NewTracer(cfg.TracerProvider),
	}
	c.sdb = session.DB{Queries: q, Pool: pool, Retry: c.retry, Owner: cfg.Owner, TTLms: c.ttlMs, Local: cfg.TTL - cfg.SafetyMargin}
	c.k = newKeeper(c)
	c.cc = combiner(c)
	c.sessionTaken = sessionTaken
	c.background.Add(1)
	go c.k.run()
	if cfg.MeterProvider != nil {
		c.tel = telemetry.New("lease", telemetry.Config{MeterProvider: cfg.MeterProvider, WithNames: cfg.MetricNames})
	}
	// Room for a slash and 20 digits; cut on a character boundary.
	c.waiterPrefix = strings.ToValidUTF8(cfg.Owner[:min(len(cfg.Owner), MaxNameLen-21)], "") + "/"
	c.ln = listener.New(listener.Config{Owner: c.k.Plain(), Context: c.bg, Pool: pool, Queries: c.q, Log: c.log,
		Client: cfg.Owner, ListenDSN: cfg.ListenDSN, ListenSlots: cfg.ListenSlots, NoListen: cfg.NoListen, PollInterval: cfg.PollInterval, TTL: cfg.TTL,
		CheckOpen: c.checkOpen, DBError: c.dbError, NewID: c.newID,
		SlotFree: func(ctx context.Context) (bool, error) {
			return inFlight(c, ctx, func(ctx context.Context) (bool, error) {
				return c.q.LeaseListenSlotFree(ctx, pool, int32(cfg.ListenSlots))
			}, nil)
		}})
	c.repl.Observe(ctx, c.pool, c.log, ErrNoSyncStandby)
	if !cfg.Retention.Disabled {
		c.k.Spawn(func() { c.pruneLoop(c.bg) }) // Close waits for it
	}
	return c, nil
}

// newID is a new waiter id, or of kind "check/" or "probe/" a new
// notification payload: the owner, a slash, kind, a number.
func (c *Client) newID(kind string) string {
	return c.waiterPrefix + kind + strconv.FormatInt(c.waiterSeq.Add(1), 10)
}

// Owner is the owner string this client writes into the lease table.
func (c *Client) Owner() string { return c.cfg.Owner }

// Config is the client's configuration with defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// Pool is the pool the client was made with, for the packages built on
// leasetable (jobs, retention) to run their own statements beside its
// leases. It returns pgbaton.ErrClosed once Close has begun, and an error
// wrapping pgbaton.ErrInvalidArgument for a nil client (so that jobs and
// retention reject one instead of panicking).
func (c *Client) Pool() (*pgxpool.Pool, error) {
	if c == nil {
		return nil, invalid("nil client")
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	return c.pool, nil
}

// Close releases every lease the client still holds (their contexts end
// with ErrReleased) in one round trip, tries again to give back leases
// whose Release or Complete could not reach the database, stops the LISTEN
// connection and makes further calls return pgbaton.ErrClosed. Like
// Release it sends even when ctx has ended, bounded by
// Config.ReleaseTimeout (or ctx's deadline, if later). Leases it could not
// give back stay held until their TTL; its error names them.
func (c *Client) Close(ctx context.Context) error {
	left, ok := c.closeKeeper()
	if !ok {
		return nil
	}
	var errs []error
	if err := c.releaseAll(ctx, stopReleased(left.held), left.back); err != nil {
		errs = append(errs, err)
	}
	cctx, cancel := c.cleanupContext(ctx)
	defer cancel()
	for _, r := range left.refs {
		_ = c.releaseRef(cctx, r.s, r.ref)
	}
	for _, l := range left.handed {
		l.endHandedOff("client closed")
	}
	for _, call := range left.calls {
		call.done <- combinedReply{err: pgbaton.ErrClosed}
	}
	c.ln.Close()
	// Background work is best effort: it must not hold Close up. Grants
	// in flight for callers that gave up finish and are given back.
	c.bgCancel()
	c.background.Wait()
	var late []grantRef
	c.k.Locked(func() { late = c.k.late })
	for _, r := range late {
		_ = c.releaseRef(cctx, r.s, r.ref)
	}
	// Last, as release_ref finds grants by their session: its row deleted,
	// leases not given back keep only their own expiry.
	if s := left.sess; s != nil && s.State.CompareAndSwap(session.Alive, session.Closed) {
		if err := c.closeSessionRow(ctx, s); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, c.dbError("close lease session", err))
		}
	}
	// Registrations whose removal was skipped because Close had begun.
	if err := c.q.LeaseStopWaitingAll(cctx, c.pool, c.waiterPrefix[:len(c.waiterPrefix)-1]); err != nil {
		errs = append(errs, c.dbError("remove waiter registrations", err))
	}
	return errors.Join(errs...)
}

// cleanupContext is what a release or completion is sent on: not ended
// with ctx, and lasting Config.ReleaseTimeout or to ctx's deadline if
// later.
func (c *Client) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := c.cfg.ReleaseTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = max(d, time.Until(dl))
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// retry is pgerr.Retry on the client's pool.
func (c *Client) retry(ctx context.Context, repeatable bool, op func(ctx context.Context) error) error {
	return pgerr.Retry(ctx, c.pool, c.log, repeatable, op)
}

func (c *Client) checkOpen() error {
	if c.k.Closed() {
		return pgbaton.ErrClosed
	}
	return nil
}
