package leasestate

import (
	"context"
	"sync/atomic"
)

// Ctx is a lease's context, made at the first use, not at the grant: most
// claimed items are completed without anyone asking for it, and making
// one per grant was 2 of the 15 allocations a claimed item cost
// (CompleteAndClaim, batch 100). The zero value has none yet.
type Ctx struct {
	p atomic.Pointer[ctxCancel]
}

type ctxCancel struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Get is the context, made now if it was not, and cancelled with the
// lease's cause whenever cell says the lease ended: End may not have run
// yet (whoever moved the status records the loss first, on its own
// goroutine), or found none to cancel (atomics are sequentially
// consistent, so one of the two sees the other). A lease read at its
// deadline, as the keeper's timer ends it, is never held.
func (c *Ctx) Get(cell *Cell) context.Context {
	if cc := c.p.Load(); cc != nil {
		if st := cell.Load(); st.State.Ended() {
			cc.cancel(st.Err) // a no-op once cancelled
		}
		return cc.ctx
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	if !c.p.CompareAndSwap(nil, &ctxCancel{ctx, cancel}) {
		cancel(nil)
		return c.p.Load().ctx
	}
	if st := cell.Load(); st.State.Ended() {
		cancel(st.Err)
	}
	return ctx
}

// End cancels the context with cause, if it was made: the lease ended.
func (c *Ctx) End(cause error) {
	if cc := c.p.Load(); cc != nil {
		cc.cancel(cause)
	}
}
