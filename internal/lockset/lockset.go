// Package lockset is what a set of locks taken together (leasetable's
// LeaseSet, advisory's LockSet) has beside its members: one context that
// ends when the first member ends, with that member's error as its cause;
// and how leasetable's sets are named and taken (Names, Take, and
// Answer, what one attempt at a set granted).
package lockset

import (
	"context"
)

// Member is a lock of a set: Err is nil while it is held, and it looks at
// the holder's own deadline, so that a lock whose deadline passed is not
// reported held before the code that watches it has noticed.
type Member interface {
	Err() error
}

// Ends is the end of a set of members: it ends when the first ends.
type Ends[M Member] struct {
	members []M
	ctx     context.Context
	cancel  context.CancelCauseFunc
}

// Watch returns the end of members. done is a member's own context, ended
// with its error when the member ends by itself: it is watched without a
// goroutine until then (context.AfterFunc), so Done closes even when
// nobody calls Err.
func Watch[M Member](members []M, done func(M) context.Context) *Ends[M] {
	ctx, cancel := context.WithCancelCause(context.Background())
	for _, m := range members {
		mctx := done(m)
		context.AfterFunc(mctx, func() { cancel(context.Cause(mctx)) })
	}
	return &Ends[M]{members: members, ctx: ctx, cancel: cancel}
}

// Err is nil while every member is held, then the error of the first
// that ended.
func (e *Ends[M]) Err() error {
	if e.ctx.Err() == nil {
		for _, m := range e.members {
			if err := m.Err(); err != nil {
				e.cancel(err)
				break
			}
		}
	}
	if e.ctx.Err() == nil {
		return nil
	}
	return context.Cause(e.ctx)
}

// Done is closed when the first member ends.
func (e *Ends[M]) Done() <-chan struct{} {
	_ = e.Err()
	return e.ctx.Done()
}

// Context is cancelled when the first member ends, with its error as the
// cause; its Err and Done look at the members as Ends's do.
func (e *Ends[M]) Context() context.Context { return endsContext[M]{e.ctx, e} }

type endsContext[M Member] struct {
	context.Context
	e *Ends[M]
}

func (c endsContext[M]) Done() <-chan struct{} { return c.e.Done() }

func (c endsContext[M]) Err() error {
	_ = c.e.Err()
	return c.Context.Err()
}
