package leasetable

import (
	"context"
	"crypto/rand"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// retry runs op and, if a fresh connection may cure its failure, once
// more: always when the server did nothing, after a broken connection only
// when op is repeatable. After a role flip the pool is reset first, so the
// retry reaches the new primary of a multi-host DSN.
func (c *Client) retry(ctx context.Context, repeatable bool, op func(ctx context.Context) error) error {
	err := op(ctx)
	f, flip := pgerr.Classify(ctx, err)
	if f == pgerr.Permanent || (f == pgerr.Ambiguous && !repeatable) {
		return err
	}
	if flip {
		c.pool.Reset() // connections in use are closed when returned
		c.log.Info("pgbaton: the server changed role (failover?); dropped the pool's connections", "error", err)
	}
	c.log.Debug("pgbaton: retrying on a fresh connection", "error", err)
	return op(ctx)
}

// newRef is a fresh request id (a random UUID, version 4) for a grant.
func newRef() pgtype.UUID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return pgtype.UUID{Bytes: b, Valid: true}
}
