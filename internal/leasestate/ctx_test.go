package leasestate

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The context ends with the lease's cause whether it is made before the
// lease ends or after.
func TestCtx(t *testing.T) {
	cause := errors.New("released")
	end := func(cell *Cell, c *Ctx) {
		cell.Update(func(s *Status) bool { return s.Move(Released, cause) })
		c.End(cause)
	}

	var before Ctx
	var cell Cell
	cell.Store(&Status{})
	ctx := before.Get(&cell)
	if before.Get(&cell) != ctx || ctx.Err() != nil {
		t.Fatal("Get made a second context, or an ended one, for a held lease")
	}
	end(&cell, &before)
	if context.Cause(ctx) != cause {
		t.Errorf("made before the end: cause %v, want %v", context.Cause(ctx), cause)
	}

	var after Ctx
	cell.Store(&Status{})
	end(&cell, &after)
	if ctx := after.Get(&cell); context.Cause(ctx) != cause {
		t.Errorf("made after the end: cause %v, want %v", context.Cause(ctx), cause)
	}
}

// Between the status moving to an end and End, which whoever moved it
// calls on its own goroutine (the keeper's timer at the deadline, after
// recording the loss), Get waits for End rather than return a context not
// yet cancelled: Lease.Err and Done, read in that window at the deadline,
// must not say the lease is held. (Before, Get returned at once: the
// select below saw it within 100ms, not cancelled.)
func TestCtxEndedBeforeEnd(t *testing.T) {
	cause := errors.New("lost")
	var c Ctx
	var cell Cell
	cell.Store(&Status{})
	made := c.Get(&cell)
	cell.Update(func(s *Status) bool { return s.Move(Lost, cause) })
	got := make(chan context.Context, 1)
	go func() { got <- c.Get(&cell) }()
	select {
	case ctx := <-got:
		t.Fatalf("Get returned before End: err %v", ctx.Err())
	case <-time.After(100 * time.Millisecond):
	}
	c.End(cause)
	if ctx := <-got; ctx != made || context.Cause(ctx) != cause {
		t.Fatalf("after End: cause %v, want %v", context.Cause(ctx), cause)
	}
	c.End(errors.New("later")) // the first cause stays
	if context.Cause(made) != cause {
		t.Fatalf("after a second End: cause %v, want %v", context.Cause(made), cause)
	}
}
