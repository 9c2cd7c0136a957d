package advisory

import (
	"sync/atomic"

	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// Stats is a snapshot of a Locker, for metrics.
type Stats struct {
	// Sessions is the number of session connections open.
	Sessions int
	// Held is the number of keys held (a key held by several RLock callers
	// of this Locker counts once, as it does on the server).
	Held int
	// Batches is the number of batches sessions sent, pings included;
	// Requests is the number of lock, unlock and ping statements in them.
	// Requests/Batches above 1 is requests sharing a round trip.
	Batches, Requests int64
	// Pipelined counts batches sent while an earlier batch of the same
	// session was still unanswered: round trips overlapping on one
	// connection.
	Pipelined int64
	// Contended counts lock calls that found the key held: ErrLocked, or a
	// wait. A Lock or RLock that waits on an idle session of the Locker's
	// sends the blocking call alone on a direct connection, and counts as
	// contended when its grant took longer than twice the session's last
	// round trip plus a millisecond; a quicker handover is not counted.
	Contended int64
	// LostSessions counts sessions lost (not closed), each taking its
	// locks with it.
	LostSessions int64
	// Connects counts connections taken from the pool for sessions and
	// waits. Idle sessions are kept as spares for waits, so
	// this grows slower than the number of waits.
	Connects int64
}

type counters struct {
	pgsession.Counters      // batches, requests, pipelined, connects
	contended, lostSessions atomic.Int64
}

// Stats returns a snapshot of the Locker's state and counters.
func (l *Locker) Stats() Stats {
	l.mu.Lock()
	st := Stats{Sessions: len(l.sessions), Held: l.total}
	l.mu.Unlock()
	st.Batches = l.stats.Batches.Load()
	st.Requests = l.stats.Requests.Load()
	st.Pipelined = l.stats.Pipelined.Load()
	st.Contended = l.stats.contended.Load()
	st.LostSessions = l.stats.lostSessions.Load()
	st.Connects = l.stats.Connects.Load()
	return st
}
