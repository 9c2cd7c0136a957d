package leasetable

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Info reads the row of lease name, for diagnostics: who holds it, until
// when and with which token. A name never used gives a zero Info.
func (c *Client) Info(ctx context.Context, name string) (Info, error) {
	if err := checkName("lease name", name); err != nil {
		return Info{}, err
	}
	row, err := c.q.LeaseGet(ctx, c.pool, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Info{Name: name}, nil
	}
	if err != nil {
		return Info{}, c.dbError("read lease "+name, err)
	}
	in := Info{Name: row.Name, Group: row.LeaseGroup.String, Owner: row.Owner.String, Token: row.Token.Int64,
		Metadata: row.Metadata}
	if row.HasExpiry {
		in.ExpiresAt = row.ExpiresAt
		in.Held = row.Owner.Valid && row.ExpiresAt.After(row.DbNow)
		in.Remaining = row.ExpiresAt.Sub(row.DbNow)
	}
	return in, nil
}

// Info is a lease row as Client.Info read it.
type Info struct {
	Name      string        // the lease's name, also when it was never used
	Group     string        // the work-item group (Register); empty for a lease of no group
	Held      bool          // a live grant exists
	Owner     string        // owner of the last grant if not released
	Token     int64         // last token granted (0: never granted)
	ExpiresAt time.Time     // database clock; zero when released
	Remaining time.Duration // ExpiresAt minus the database clock at the read
	Metadata  []byte        // JSON from the last grant that set any (Elect: {"value": ...}), else {}; nil for a name never used
}
