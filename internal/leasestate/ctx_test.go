package leasestate

import (
	"context"
	"errors"
	"testing"
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

// Between the status moving to an end and End, on another goroutine
// (the keeper's timer at the deadline, while it records the loss), Get
// already returns an ended context: Lease.Err and Done, read in that
// window at the deadline, must not say the lease is held.
func TestCtxEndedBeforeEnd(t *testing.T) {
	cause := errors.New("lost")
	var c Ctx
	var cell Cell
	cell.Store(&Status{})
	ctx := c.Get(&cell)
	cell.Update(func(s *Status) bool { return s.Move(Lost, cause) })
	if got := c.Get(&cell); context.Cause(got) != cause {
		t.Fatalf("ended, End not called yet: cause %v, want %v", context.Cause(got), cause)
	}
	if context.Cause(ctx) != cause {
		t.Fatalf("the context made before: cause %v, want %v", context.Cause(ctx), cause)
	}
	c.End(errors.New("later")) // the first cause stays
	if context.Cause(ctx) != cause {
		t.Fatalf("after End: cause %v, want %v", context.Cause(ctx), cause)
	}
}
