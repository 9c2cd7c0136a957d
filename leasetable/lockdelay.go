package leasetable

import (
	"time"

	"github.com/pgbaton/pgbaton/internal/leasestate"
)

// MaxLockDelay is the longest Config.LockDelay: 60s, Consul's bound too.
// The database refuses a longer one (pgbaton.lock_delay_max_ms).
const MaxLockDelay = 60 * time.Second

// lockDelayMs is Config.LockDelay as the database takes it: whole
// milliseconds, rounded up, so a delay is never shortened.
func (c Config) lockDelayMs() int64 { return ceilMs(c.LockDelay) }

// lostNames are the names of the leases among leases that were lost: given
// back, they keep their lock-delay (pgbaton.release_many's p_lost), where
// a lease released by its holder frees its name at once. Nil when none.
func lostNames(leases []*Lease) []string {
	var out []string
	for _, l := range leases {
		if l.st.Load().State == leasestate.Lost {
			out = append(out, l.name)
		}
	}
	return out
}
