package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/replication"
)

// FailoverGrace is a database's failover grace (see the package doc,
// "Failover"): after a timeline change, nothing is granted until the
// longest TTL in use has passed, because the old primary's last grants may
// be lost while their holders still work.
type FailoverGrace struct {
	// Enabled is the database's setting (SQL pgbaton.set_failover_grace(on,
	// reason)); on unless an operator turned it off.
	Enabled bool `json:"enabled"`
	Active  bool `json:"active"` // no grant is made now, until Until
	// Until is when the last grace ends or ended, database clock; zero
	// when no timeline change ever imposed one.
	Until time.Time `json:"until"`
	// StartedAt is when it began: when the new timeline's epoch was stored.
	// Zero while the timeline change is not stored yet (every grant is
	// refused until it is; Until is then where the grace would end if it
	// began now).
	StartedAt time.Time `json:"started_at"`
	// FromTimeline is the PostgreSQL timeline before the change that
	// imposed it; 0 when no timeline change ever did.
	FromTimeline int64 `json:"from_timeline"`
	// ToTimeline is the timeline after that change: the one pgbaton has
	// stored, or the server's current one while that is not stored yet.
	ToTimeline int64         `json:"to_timeline"`
	LongestTTL time.Duration `json:"longest_ttl_ns"` // the longest TTL in use: a grace's length
	Remaining  time.Duration `json:"remaining_ns"`   // Until minus the database clock while Active, else 0
}

// String says it in one line, for status output.
func (g FailoverGrace) String() string { return replication.Grace(g).String() }

// FailoverGraceOf reads the failover grace of the database behind pool.
func FailoverGraceOf(ctx context.Context, pool *pgxpool.Pool) (FailoverGrace, error) {
	if pool == nil {
		return FailoverGrace{}, fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	g, err := replication.ReadGrace(ctx, pool)
	if err != nil {
		return FailoverGrace{}, mapDBError("read the failover grace", err)
	}
	return FailoverGrace(g), nil
}

// FailoverGrace reads the failover grace of the client's database.
func (c *Client) FailoverGrace(ctx context.Context) (FailoverGrace, error) {
	if err := c.checkOpen(); err != nil {
		return FailoverGrace{}, err
	}
	return FailoverGraceOf(ctx, c.pool)
}

// startGrace stores the epoch of a new timeline after a grant was refused
// for it: its grace runs from then, and every grant is refused until then.
// Best effort: the next keep-alive does it otherwise.
func (c *Client) startGrace(ctx context.Context) {
	if err := c.q.SyncEpoch(ctx, c.pool); err != nil {
		c.log.Debug("pgbaton: storing the epoch of a new timeline failed", "error", err)
	}
}
