package pgsession

import (
	"errors"
	"fmt"

	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// The errors a Conn returns that package advisory exports under the same
// names (documented there): they are advisory's, so they say so.
var (
	ErrLockLost       = errors.New("advisory: lock lost")
	ErrLockTableFull  = errors.New("advisory: lock table full")
	ErrSessionPooling = errors.New("advisory: connection goes through a transaction-pooling proxy (backend pid changed between statements); session advisory locks need a direct connection: use XactLock or package leasetable behind PgBouncer")
)

// MapError turns server errors that have a meaning here into these
// sentinels, or the shared ones (internal/pgerr), keeping the original in
// the chain.
func MapError(op string, err error) error {
	if err == nil {
		return nil
	}
	switch pgerr.Code(err) {
	case pgerr.InvalidStatementName:
		return fmt.Errorf("%w: %s: %w", ErrSessionPooling, op, err)
	case pgerr.OutOfSharedMemory:
		return fmt.Errorf("%w: %s: the server's lock table is full (raise max_locks_per_transaction or hold fewer locks): %w", ErrLockTableFull, op, err)
	}
	if mapped, ok := pgerr.Map(op, err); ok {
		return mapped
	}
	return fmt.Errorf("advisory: %s: %w", op, err)
}
