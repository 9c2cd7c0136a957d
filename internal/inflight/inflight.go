// Package inflight sends a statement that may grant leases so that no
// grant is left to a caller that gave up.
//
// Send runs the statement on a context of its own, bounded by the
// caller's bound (a later reply is of no use), and when the caller's ctx
// ends first the caller gets ctx's error (CtxErr) at once while the
// abandoned callback receives the reply when it comes, to give back
// whatever it granted. A reply that is there when ctx ends goes to the
// caller. The statement's goroutine, or the caller's own run of it, is
// work the owner's Runner counts: its owner's Close waits for it, and
// once the Runner refuses new work Send returns pgbaton.ErrClosed
// without sending anything.
//
// NewRef makes the request id such a statement is sent under.
package inflight

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// Runner is what Send needs of the owner of the work it starts.
type Runner interface {
	// Enter counts work the owner's Close waits for, and reports whether
	// it did: false once Close has begun. Exit ends what it counted.
	Enter() bool
	Exit()
	// Spawn runs fn on a goroutine the owner's Close waits for, and
	// reports whether it did: false once Close has begun.
	Spawn(fn func()) bool
}

// Send sends a statement through send so that no grant is left to a
// caller that gave up (the package doc): send runs on a context bounded
// by bound, and abandoned, when the caller gave up first, gets the reply
// on a context bounded by abandonBound. abandoned may be nil when a reply
// nobody reads needs no cleanup. gaveUp reports that the caller gave up
// and abandoned, not the caller, gets the reply; it is false when
// abandoned is nil. A statement bound cut off comes back as
// pgerr.ErrSlow: it may still commit.
//
// Why send runs on a goroutine of its own: the caller must be able to
// return the instant ctx ends, and the statement must still run to its
// reply, which says what it granted. Sending on ctx instead would have
// pgx interrupt the statement and close its connection: whether it
// committed would be unknown, so every call given up would cost a
// connection and a give-back by request id. A ctx that can never end (Done
// is nil) cannot be given up: then the statement runs on the caller's
// goroutine. Either way r counts it, so its owner's Close waits for it.
func Send[T any](ctx context.Context, r Runner, bound, abandonBound time.Duration, send func(context.Context) (T, error), abandoned func(context.Context, T, error)) (_ T, gaveUp bool, _ error) {
	var zero T
	if ctx.Err() != nil {
		return zero, false, CtxErr(ctx)
	}
	if ctx.Done() == nil {
		if !r.Enter() {
			return zero, false, pgbaton.ErrClosed
		}
		defer r.Exit()
		sctx, cancel := context.WithTimeout(ctx, bound)
		defer cancel()
		v, err := send(sctx)
		return v, false, pgerr.Bounded(sctx, bound, err)
	}
	type reply struct {
		v   T
		err error
	}
	// The reply goes into ch; then whichever of the sender and the caller
	// giving up takes the turn first decides who reads it.
	ch := make(chan reply, 1)
	var taken atomic.Bool
	ok := r.Spawn(func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
		v, err := send(sctx)
		err = pgerr.Bounded(sctx, bound, err)
		cancel()
		ch <- reply{v, err}
		if taken.CompareAndSwap(false, true) {
			return // the caller reads it
		}
		<-ch // the caller gave up
		if abandoned == nil {
			return
		}
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonBound)
		defer cancel()
		abandoned(gctx, v, err)
	})
	if !ok {
		return zero, false, pgbaton.ErrClosed
	}
	select {
	case rep := <-ch:
		return rep.v, false, rep.err
	case <-ctx.Done():
	}
	if taken.CompareAndSwap(false, true) {
		return zero, abandoned != nil, CtxErr(ctx)
	}
	rep := <-ch // the sender took the turn: its reply is there
	return rep.v, false, rep.err
}

// CtxErr is the error of an ended ctx: its Err, and its cause when that
// says more.
func CtxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}

// NewRef is a fresh request id (a random UUID, version 4) for a statement
// that may grant leases: a repeat after a broken connection finds the
// grants the first one made, and a caller that gave up has them given
// back by it.
func NewRef() pgtype.UUID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return pgtype.UUID{Bytes: b, Valid: true}
}
