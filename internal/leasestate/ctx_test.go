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
