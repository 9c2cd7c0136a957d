package leasetable

import (
	"context"
	"crypto/rand"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// retry is pgerr.Retry on the client's pool.
func (c *Client) retry(ctx context.Context, repeatable bool, op func(ctx context.Context) error) error {
	return pgerr.Retry(ctx, c.pool, c.log, repeatable, op)
}

// newRef is a fresh request id (a random UUID, version 4) for a grant.
func newRef() pgtype.UUID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return pgtype.UUID{Bytes: b, Valid: true}
}
