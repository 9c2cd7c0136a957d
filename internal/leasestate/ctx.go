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

// Get is the context, made now if it was not: cancelled at once with the
// lease's cause when cell says the lease ended before (End found none to
// cancel: atomics are sequentially consistent, so one of the two sees the
// other). When cell says the lease ended and the context is not cancelled
// yet, Get waits until it is: whoever moved the status calls End next,
// after recording a loss in the metrics, so a lease read at its deadline
// while the keeper's timer ends it is never held, and whoever finds Done
// closed finds the loss recorded.
func (c *Ctx) Get(cell *Cell) context.Context {
	if cc := c.p.Load(); cc != nil {
		if st := cell.Load(); st.State.Ended() {
			<-cc.ctx.Done()
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
