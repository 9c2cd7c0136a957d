package advisory

import (
	"context"
	"fmt"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// Check reports whether the Locker can take locks: it makes a round trip
// on a session (opening one if needed), which also verifies that the
// server is a primary and that no transaction-pooling proxy is in
// between. For readiness probes (package health).
func (l *Locker) Check(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", pgbaton.ErrInvalidArgument)
	}
	s, err := l.reserveSession(ctx)
	if err != nil {
		l.logRefusal("check", err)
		return err
	}
	defer l.unreserve(s)
	if _, err := s.DoClaimed(pgsession.Ping, lockID{}); err != nil {
		return fmt.Errorf("advisory: check: %w", err)
	}
	return nil
}
