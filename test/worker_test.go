package test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/test/check"
)

// workerArgs is what the parent passes to a worker process.
type workerArgs struct {
	URL      string        // through the worker's own fault proxy
	Proc     int           // incarnation id
	Keys     []string      // lease names to contend for
	TTL      time.Duration // lease TTL
	Seed     uint64        // the worker's random choices
	Broken   bool          // the deliberately broken variant, see brokenWorker
	StopFile string        // the worker stops when this file exists
	Writes   int           // guarded writes per grant
	Work     time.Duration // simulated work after each write, up to this long
	Advisory bool          // take advisory session locks instead of leases
}

func (a workerArgs) encode() []string {
	return []string{a.URL, strconv.Itoa(a.Proc), strings.Join(a.Keys, ","), a.TTL.String(),
		strconv.FormatUint(a.Seed, 10), strconv.FormatBool(a.Broken), a.StopFile,
		strconv.Itoa(a.Writes), a.Work.String(), strconv.FormatBool(a.Advisory)}
}

func decodeWorkerArgs(s []string) (a workerArgs, err error) {
	if len(s) != 10 {
		return a, fmt.Errorf("worker: want 10 args, got %d", len(s))
	}
	a.URL, a.Keys, a.StopFile = s[0], strings.Split(s[2], ","), s[6]
	var errs [7]error
	a.Proc, errs[0] = strconv.Atoi(s[1])
	a.TTL, errs[1] = time.ParseDuration(s[3])
	a.Seed, errs[2] = strconv.ParseUint(s[4], 10, 64)
	a.Broken, errs[3] = strconv.ParseBool(s[5])
	a.Writes, errs[4] = strconv.Atoi(s[7])
	a.Work, errs[5] = time.ParseDuration(s[8])
	a.Advisory, errs[6] = strconv.ParseBool(s[9])
	return a, errors.Join(errs[:]...)
}

// childWorker is a chaos worker: it loops acquire → guarded writes →
// release on random keys until the stop file appears, printing its history.
//
// A correct worker only claims to hold a lease at an instant it has
// checked: the lease's context is live and its local deadline has not
// passed. The broken variant (Broken) skips that check and writes to the
// ledger without the fence, the way a naive client would: the checkers must
// catch it.
func childWorker(ctx context.Context, raw []string) error {
	a, err := decodeWorkerArgs(raw)
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(a.URL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("chaos-p%d", a.Proc)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := &worker{a: a, pool: pool, em: check.NewEmitter(a.Proc, os.Stdout), rng: rand.New(rand.NewPCG(a.Seed, uint64(a.Proc)))}
	if a.Advisory {
		// g = PingInterval + PingTimeout plays the part of the TTL.
		w.locker, err = advisory.New(pool, advisory.Config{PingInterval: a.TTL / 3, PingTimeout: a.TTL * 2 / 3})
	} else {
		// New checks the schema: retry while the nemesis keeps the server
		// away (a restart right after this worker was started).
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			w.client, err = leasetable.New(ctx, pool, leasetable.Config{Owner: fmt.Sprintf("chaos-p%d", a.Proc), TTL: a.TTL})
			if err == nil || time.Since(start) > 30*time.Second {
				break
			}
		}
	}
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if w.locker != nil {
			_ = w.locker.Close(cctx)
		} else {
			_ = w.client.Close(cctx)
		}
	}()
	fmt.Println("ready")
	for n := 0; ; n++ {
		if _, err := os.Stat(a.StopFile); err == nil {
			return nil
		}
		w.round(ctx, n)
	}
}

type worker struct {
	a      workerArgs
	pool   *pgxpool.Pool
	client *leasetable.Client // leases, or
	locker *advisory.Locker   // advisory session locks
	em     *check.Emitter
	rng    *rand.Rand
}

// held is a granted lease or advisory lock, as the worker uses it.
type held interface {
	Name() string
	Token() int64 // 0 for advisory locks, which have no fencing token
	// valid reports whether the holder may still count on it now.
	valid() bool
	release(ctx context.Context) error
}

type heldLease struct{ *leasetable.Lease }

func (l heldLease) valid() bool {
	return l.Err() == nil && time.Now().Before(l.Deadline())
}
func (l heldLease) release(ctx context.Context) error { return l.Release(ctx) }

type heldLock struct {
	*advisory.Lock
	name string
}

func (l heldLock) Name() string                      { return l.name }
func (l heldLock) Token() int64                      { return 0 }
func (l heldLock) valid() bool                       { return l.Err() == nil }
func (l heldLock) release(ctx context.Context) error { return l.Unlock(ctx) }

// acquire takes key, waiting at most 2 TTLs. It reports the outcome type
// for a failure: fail when the library promises nothing was granted (the
// wait's context ended), unknown otherwise (a connection lost mid-call may
// hide a grant).
func (w *worker) acquire(ctx context.Context, key string) (held, string, error) {
	actx, cancel := context.WithTimeout(ctx, 2*w.a.TTL)
	defer cancel()
	var h held
	var err error
	if w.locker != nil {
		var lk *advisory.Lock
		if lk, err = w.locker.Lock(actx, advisory.Name(key)); err == nil {
			h = heldLock{lk, key}
		}
	} else {
		var l *leasetable.Lease
		if l, err = w.client.Acquire(actx, key); err == nil {
			h = heldLease{l}
		}
	}
	switch {
	case err == nil:
		return h, check.EvOK, nil
	case errors.Is(err, context.DeadlineExceeded):
		return nil, check.EvFail, err
	default:
		return nil, check.EvUnknown, err
	}
}

// round is one acquire → writes → release cycle on a random key.
func (w *worker) round(ctx context.Context, n int) {
	key := w.a.Keys[w.rng.IntN(len(w.a.Keys))]
	w.em.Emit(check.Event{Key: key, Op: check.OpAcquire, Type: check.EvInvoke})
	l, typ, err := w.acquire(ctx, key)
	if err != nil {
		w.em.Emit(check.Event{Key: key, Op: check.OpAcquire, Type: typ, Err: err.Error()})
		if typ == check.EvUnknown {
			// The server is unreachable (restart, stall): pace the
			// retries instead of spinning on connection errors.
			time.Sleep(50*time.Millisecond + time.Duration(w.rng.Int64N(int64(100*time.Millisecond))))
		}
		return
	}
	lastValid := check.MonoNow() // granted by now
	w.em.Emit(check.Event{Key: key, Op: check.OpAcquire, Type: check.EvOK, Mono: lastValid, Token: l.Token()})
	for i := range w.a.Writes {
		t, ok := w.valid(l)
		if !ok {
			break
		}
		lastValid = t
		id := fmt.Sprintf("p%d-%d-%d", w.a.Proc, n, i)
		// The invoke carries the instant the lease was checked valid: the
		// critical section provably extends to it.
		w.em.Emit(check.Event{Key: key, Op: check.OpWrite, Type: check.EvInvoke, Mono: t, Token: l.Token(), OpID: id})
		typ, err := w.write(ctx, l, id)
		ev := check.Event{Key: key, Op: check.OpWrite, Type: typ, Token: l.Token(), OpID: id}
		if err != nil {
			ev.Err = err.Error()
		}
		w.em.Emit(ev)
		if w.a.Work > 0 {
			time.Sleep(time.Duration(w.rng.Int64N(int64(w.a.Work)))) // the work itself
		}
	}
	if t, ok := w.valid(l); ok {
		lastValid = t
	}
	// The release's invoke is the end of the critical section: the last
	// instant the worker knew it held the lease.
	w.em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: l.Token()})
	rctx, cancel := context.WithTimeout(ctx, w.a.TTL)
	err = l.release(rctx)
	cancel()
	switch {
	case err == nil:
		w.em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvOK, Token: l.Token()})
	case errors.Is(err, leasetable.ErrNotHeld) || errors.Is(err, leasetable.ErrLeaseLost) || errors.Is(err, advisory.ErrLockLost):
		w.em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvFail, Token: l.Token(), Err: err.Error()})
	default:
		w.em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvUnknown, Token: l.Token(), Err: err.Error()})
	}
}

// valid stamps the time, then checks that the lease is still held: its
// context is live and its local deadline (before the database's expiry)
// has not passed. The broken variant believes it always holds.
func (w *worker) valid(l held) (int64, bool) {
	t := check.MonoNow()
	if w.a.Broken {
		return t, true
	}
	return t, l.valid()
}

// write appends one row to the ledger under the lease: fenced by
// fencedwrite.InTx, or in the broken variant, unguarded. The per-key head
// row serialises the writes of a key in commit order (seq), which is what
// the fencing checker orders by.
func (w *worker) write(ctx context.Context, l held, id string) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, w.a.TTL)
	defer cancel()
	body := func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(wctx, "UPDATE chaos_head SET seq = seq + 1 WHERE key = $1 RETURNING seq", l.Name()).Scan(&seq); err != nil {
			return err
		}
		_, err := tx.Exec(wctx, "INSERT INTO chaos_ledger (key, token, op_id, seq) VALUES ($1, $2, $3, $4)", l.Name(), l.Token(), id, seq)
		return err
	}
	if w.a.Broken || w.locker != nil {
		// Advisory locks have no token to fence with: a plain write.
		return plainWrite(wctx, w.pool, body)
	}
	err := fencedwrite.InTx(wctx, w.pool, l, body)
	switch {
	case err == nil:
		return check.EvOK, nil
	case errors.Is(err, fencedwrite.ErrCommitUnknown):
		return check.EvUnknown, err
	default:
		// InTx returns nil only if the transaction committed and
		// ErrCommitUnknown when it cannot tell: anything else wrote nothing.
		return check.EvFail, err
	}
}

// plainWrite is the write without the fence: no Guard, so a holder whose
// lease was taken over still commits.
func plainWrite(ctx context.Context, pool *pgxpool.Pool, body func(pgx.Tx) error) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return check.EvFail, err
	}
	if err := body(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return check.EvFail, err
	}
	if err := tx.Commit(ctx); err != nil {
		return check.EvUnknown, err
	}
	return check.EvOK, nil
}
