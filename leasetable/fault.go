package leasetable

import (
	"fmt"

	"github.com/pgbaton/pgbaton/internal/leasefault"
)

// pgbatontest forces faults on a Lease through leasefault: this is the one
// way in.
func init() {
	leasefault.Of = func(v any) leasefault.Lease {
		l := v.(*Lease)
		return leasefault.Lease{Name: l.name, Token: l.token, TTL: l.c.cfg.TTL, Pool: l.c.pool, Lose: l.loseTo}
	}
}

// loseTo ends l as the fault named by cause would, with the error that
// fault gives; pgbatontest has made the fault true in the database first.
func (l *Lease) loseTo(cause string) {
	var err error
	switch cause {
	case CauseClockStep:
		err = fmt.Errorf("%w: %w: %q token %d: the database clock stepped past its expiry", ErrLeaseLost, ErrClockStep, l.name, l.token)
	case CauseSuperseded:
		err = fmt.Errorf("%w: %w: %q token %d was taken over", ErrLeaseLost, ErrNotHeld, l.name, l.token)
	default:
		cause = CauseExpired
		err = fmt.Errorf("%w: %q token %d: no successful keep-alive or renewal before the local deadline", ErrLeaseLost, l.name, l.token)
	}
	l.lose(err, cause)
}
