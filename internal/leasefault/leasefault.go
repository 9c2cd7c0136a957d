// Package leasefault is how pgbatontest reaches into a *leasetable.Lease,
// which leasetable's public API does not open: the grant's row, its
// client's pool and TTL, and telling the client now that it lost the
// grant, as a real fault would. leasetable sets Of when it is loaded;
// nothing else may.
package leasefault

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Lease is one grant as pgbatontest sees it.
type Lease struct {
	Name  string
	Token int64
	TTL   time.Duration
	Pool  *pgxpool.Pool
	// Lose ends the grant on its client as a fault of cause would
	// (leasetable's CauseExpired, CauseClockStep or CauseSuperseded), once
	// pgbatontest has made that fault true in the database.
	Lose func(cause string)
}

// Of returns what pgbatontest needs of l, a *leasetable.Lease.
var Of func(l any) Lease
