package leasetable

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/replication"
)

// ErrNoSyncStandby means the primary has standbys but commits do not wait
// for any of them: a grant (or a fenced write) acknowledged just before a
// failover may be missing on the promoted standby, so the lease can be
// granted again at once while its holder works on, and only fenced writes
// keep the two apart (tokens never go backwards). Synchronous replication
// (Patroni: synchronous_mode) closes that window; see docs/production.md.
var ErrNoSyncStandby = errors.New("leasetable: the primary has standbys but none is synchronous: grants acknowledged just before a failover can be lost")

// ReplicationStatus is how the database's standbys protect acknowledged
// grants, as the primary sees it.
type ReplicationStatus struct {
	// Standbys is how many physical standbys stream from the primary.
	// Managed services that replicate below PostgreSQL (Aurora, RDS
	// Multi-AZ instances, Cloud SQL HA) show none here.
	Standbys int
	// SyncStandbys is how many of them are synchronous (sync or quorum),
	// or -1 when the role may not see it (pg_stat_replication hides
	// sync_state from roles without pg_read_all_stats).
	SyncStandbys int
	// SynchronousStandbyNames is the primary's synchronous_standby_names.
	SynchronousStandbyNames string
	// SynchronousCommit is synchronous_commit as the pool's sessions have
	// it; off and local do not wait for standbys.
	SynchronousCommit string
}

// Err is nil when no acknowledged grant can be lost in a failover to one
// of the standbys (or there is no standby), and an error wrapping
// ErrNoSyncStandby saying why otherwise. Client.Check does not fail for it
// (replication is the database's property, not the client's: a readiness
// probe failing for it would take every replica of a service out at once);
// wrap it in a health.Checker to make it one.
func (r ReplicationStatus) Err() error { return replication.Status(r).Err(ErrNoSyncStandby) }

// ReplicationOf reads the replication status of the primary behind pool.
func ReplicationOf(ctx context.Context, pool *pgxpool.Pool) (ReplicationStatus, error) {
	if pool == nil {
		return ReplicationStatus{}, fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	r, err := replication.Read(ctx, pool)
	if err != nil {
		return ReplicationStatus{}, fmt.Errorf("leasetable: read replication status: %w", err)
	}
	return ReplicationStatus(r), nil
}

// Replication reads the replication status of the client's database.
func (c *Client) Replication(ctx context.Context) (ReplicationStatus, error) {
	if err := c.checkOpen(); err != nil {
		return ReplicationStatus{}, err
	}
	return ReplicationOf(ctx, c.pool)
}
