// Package schema reads the pgbaton schema's version with plain queries and
// compares it with the newest migration this build knows, so that advisory,
// leasetable and fencedwrite can refuse an unmigrated database without
// linking golang-migrate. The migrations package applies the files with
// golang-migrate and reports through this package, so both say the same.
package schema

//go:generate go run ./gen -dir ../../migrations -out latest.go

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// ErrDirty is migrations.ErrDirty: a previous migration failed half-way.
var ErrDirty = errors.New("pgbaton: schema migration is dirty (a previous migration failed)")

// ErrPreRelease is migrations.ErrPreRelease: the database was migrated by a
// development build from before the schema's baseline (versions below
// Baseline), whose migration chain no release carries. It is always
// wrapped together with pgbaton.ErrNotMigrated.
var ErrPreRelease = errors.New("pgbaton: schema written by a pre-release development build")

// Version returns the schema version and whether it is dirty; 0 when
// pgbaton's schema is not in this database. The version is the schema's
// own record (pgbaton.schema_version), which every migration file sets,
// whichever tool applied it. Dirty is golang-migrate's flag, when
// migrations.Up (or golang-migrate with pgbaton's table) ran: a file that
// failed half-way. A database without the record is read from
// golang-migrate's table alone, as pre-release builds left it.
func Version(ctx context.Context, q db.DBTX) (version uint, dirty bool, err error) {
	own, err := db.New().SchemaVersion(ctx, q)
	switch {
	case errors.Is(err, pgx.ErrNoRows), pgerr.Code(err) == pgerr.UndefinedTable:
		own = -1
	case err != nil:
		return 0, false, fmt.Errorf("pgbaton: read schema version: %w", err)
	}
	gm, err := db.New().SchemaMigrations(ctx, q)
	switch {
	case errors.Is(err, pgx.ErrNoRows), pgerr.Code(err) == pgerr.UndefinedTable:
		gm = db.PgbatonSchemaMigration{Version: -1}
	case err != nil:
		return 0, false, fmt.Errorf("pgbaton: read schema version: %w", err)
	}
	// They agree, except where a file failed: that left the record at the
	// version before it (each file is one transaction), golang-migrate's
	// at the failed one, dirty.
	return uint(max(int64(own), gm.Version, 0)), gm.Dirty, nil
}

// Check reads the version and compares it with Latest; see CheckVersion.
func Check(ctx context.Context, q db.DBTX) error {
	v, dirty, err := Version(ctx, q)
	if err != nil {
		return err
	}
	return CheckVersion(v, dirty)
}

// CheckVersion returns nil when v is Latest and clean, else an error that
// wraps ErrDirty, pgbaton.ErrNotMigrated (with ErrPreRelease for a version
// below Baseline) or pgbaton.ErrSchemaTooNew.
func CheckVersion(v uint, dirty bool) error {
	switch {
	case dirty:
		return fmt.Errorf("%w at version %d", ErrDirty, v)
	case v == 0:
		return fmt.Errorf("%w: no pgbaton schema in this database; run `pgbaton migrate up` or migrations.Up", pgbaton.ErrNotMigrated)
	case v < Baseline:
		// Nothing was ever released on those versions, so there is no
		// upgrade path: the schema is dropped and made again.
		return fmt.Errorf("%w: %w (version %d; this build's schema starts at %d and cannot upgrade it): "+
			"stop every client, run `DROP SCHEMA pgbaton CASCADE` (every lock, lease, run and fenced value is lost), "+
			"then `pgbaton migrate up` or migrations.Up", pgbaton.ErrNotMigrated, ErrPreRelease, v, Baseline)
	case v < Latest:
		return fmt.Errorf("%w: schema version %d, this build needs %d; run `pgbaton migrate up` or migrations.Up", pgbaton.ErrNotMigrated, v, Latest)
	case v > Latest:
		return fmt.Errorf("%w: database is at version %d, this build knows up to %d; upgrade pgbaton", pgbaton.ErrSchemaTooNew, v, Latest)
	}
	return nil
}
