package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
)

// Grace is leasetable.FailoverGrace.
type Grace struct {
	Enabled      bool
	Active       bool
	Until        time.Time
	StartedAt    time.Time // zero while the timeline change is not stored yet
	FromTimeline int64
	ToTimeline   int64
	LongestTTL   time.Duration
	Remaining    time.Duration
}

// ReadGrace reads the failover grace of the database behind pool; its
// error is the query's, for the caller to wrap.
func ReadGrace(ctx context.Context, pool db.DBTX) (Grace, error) {
	row, err := db.New().FailoverGrace(ctx, pool)
	if err != nil {
		return Grace{}, err
	}
	g := Grace{Enabled: row.Enabled, Active: row.Active, FromTimeline: row.FromTimeline.Int64,
		ToTimeline: row.ToTimeline.Int64, LongestTTL: time.Duration(row.TtlInUseMs) * time.Millisecond}
	if row.GraceUntil != nil {
		g.Until = *row.GraceUntil
	}
	if row.StartedAt != nil {
		g.StartedAt = *row.StartedAt
	}
	if g.Active {
		g.Remaining = max(g.Until.Sub(row.DbNow), 0)
	}
	return g, nil
}

// String says it in one line, for status output.
func (g Grace) String() string {
	onOff := "on"
	if !g.Enabled {
		onOff = "off"
	}
	switch {
	case g.Active && g.StartedAt.IsZero():
		return fmt.Sprintf("%s; holding every grant back: timeline %d -> %d not stored yet, then %s (longest TTL in use)",
			onOff, g.FromTimeline, g.ToTimeline, g.LongestTTL)
	case g.Active:
		return fmt.Sprintf("%s; holding every grant back for %s more, until %s (timeline %d -> %d at %s, longest TTL in use %s)",
			onOff, g.Remaining.Round(time.Millisecond), g.Until.Format(time.RFC3339), g.FromTimeline, g.ToTimeline,
			g.StartedAt.Format(time.RFC3339), g.LongestTTL)
	case g.Until.IsZero():
		return fmt.Sprintf("%s; none imposed (longest TTL in use %s)", onOff, g.LongestTTL)
	}
	return fmt.Sprintf("%s; last ended %s (timeline %d -> %d, longest TTL in use %s)",
		onOff, g.Until.Format(time.RFC3339), g.FromTimeline, g.ToTimeline, g.LongestTTL)
}
