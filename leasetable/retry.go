package leasetable

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// failure says what a failed statement tells about sending it again.
type failure int8

const (
	// permanentFailure: sending it again would fail the same way, or the
	// caller gave up.
	permanentFailure failure = iota
	// notApplied: the server did nothing (it was never sent, or the server
	// refused it before changing anything): any statement may be sent
	// again.
	notApplied
	// ambiguous: the connection broke while the statement may have run;
	// only a statement that is safe to repeat may be sent again.
	ambiguous
)

// classify tells what err means for a retry, and whether the server
// changed role (a failover), which makes every pooled connection stale.
func classify(ctx context.Context, err error) (f failure, roleFlip bool) {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return permanentFailure, false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerr.ReadOnlyTransaction:
			// The old primary came back as a standby, or a multi-host DSN
			// reached one: refused before anything changed.
			return notApplied, true
		case pgerr.AdminShutdown, pgerr.CrashShutdown, pgerr.CannotConnectNow:
			return ambiguous, true
		}
		return permanentFailure, false
	}
	if pgconn.SafeToRetry(err) {
		return notApplied, false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return ambiguous, false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return notApplied, false
	}
	return permanentFailure, false
}

// retry runs op and, if a fresh connection may cure its failure, once
// more: always when the server did nothing, after a broken connection only
// when op is repeatable. After a role flip the pool is reset first, so the
// retry reaches the new primary of a multi-host DSN.
func (c *Client) retry(ctx context.Context, repeatable bool, op func(ctx context.Context) error) error {
	err := op(ctx)
	f, flip := classify(ctx, err)
	if f == permanentFailure || (f == ambiguous && !repeatable) {
		return err
	}
	if flip {
		c.pool.Reset() // connections in use are closed when returned
		c.log.Info("pgbaton: the server changed role (failover?); dropped the pool's connections", "error", err)
	}
	c.log.Debug("pgbaton: retrying on a fresh connection", "error", err)
	return op(ctx)
}

// newRef is a fresh request id (a random UUID, version 4) for a grant.
func newRef() pgtype.UUID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return pgtype.UUID{Bytes: b, Valid: true}
}
