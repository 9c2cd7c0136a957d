package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Failure says what a failed statement tells about sending it again.
type Failure int8

const (
	// Permanent: sending it again would fail the same way, or the caller
	// gave up.
	Permanent Failure = iota
	// NotApplied: the server did nothing (it was never sent, or the server
	// refused it before changing anything): any statement may be sent
	// again.
	NotApplied
	// Ambiguous: the connection broke, or the statement's own bound cut it
	// off (ErrSlow), while it may have run; only a statement that is safe
	// to repeat may be sent again.
	Ambiguous
)

// ErrSlow marks a statement cut off by a bound of its own, not by its
// caller: a statement that may grant leases gets no longer than the lease's
// TTL (a later reply is of no use), and a server too slow to answer in
// that time leaves it Ambiguous: pgx closes the connection at the
// deadline and sends a cancel request, which may land after the commit. A
// wait looks again after it; what it may have granted is given back by
// request id.
var ErrSlow = errors.New("no reply in time")

// Bounded is err marked as ErrSlow when it is the deadline of bctx, the
// context the statement ran on, bounded by bound and by nothing else; err
// otherwise.
func Bounded(bctx context.Context, bound time.Duration, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(bctx.Err(), context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w (bound %v): %w", ErrSlow, bound, err)
}

// Classify tells what err means for a retry, and whether the server
// changed role (a failover), which makes every pooled connection stale.
func Classify(ctx context.Context, err error) (f Failure, roleFlip bool) {
	switch {
	case err == nil || ctx.Err() != nil:
		return Permanent, false
	case errors.Is(err, ErrSlow):
		return Ambiguous, false
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return Permanent, false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case ReadOnlyTransaction:
			// The old primary came back as a standby, or a multi-host DSN
			// reached one: refused before anything changed.
			return NotApplied, true
		case AdminShutdown, CrashShutdown, CannotConnectNow:
			return Ambiguous, true
		}
		return Permanent, false
	}
	if pgconn.SafeToRetry(err) {
		return NotApplied, false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return Ambiguous, false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return NotApplied, false
	}
	return Permanent, false
}

// Retry runs op and, if a fresh connection may cure its failure, once
// more: always when the server did nothing, after a broken connection only
// when op is repeatable. After a role flip pool is reset first, so the
// retry reaches the new primary of a multi-host DSN.
func Retry(ctx context.Context, pool interface{ Reset() }, log *slog.Logger, repeatable bool, op func(ctx context.Context) error) error {
	err := op(ctx)
	f, flip := Classify(ctx, err)
	if f == Permanent || (f == Ambiguous && !repeatable) {
		return err
	}
	if flip {
		pool.Reset() // connections in use are closed when returned
		log.Info("pgbaton: the server changed role (failover?); dropped the pool's connections", "error", err)
	}
	log.Debug("pgbaton: retrying on a fresh connection", "error", err)
	return op(ctx)
}
