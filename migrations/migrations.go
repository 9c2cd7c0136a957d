// Package migrations installs and upgrades pgbaton's objects in the schema
// pgbaton, with golang-migrate and the migration files embedded in this
// package (NNNN_name.up.sql / .down.sql).
//
// The files themselves are also pgbaton.Migrations(), for services that
// apply them with their own tool: every file records the schema's version
// in pgbaton.schema_version, which the library checks, so this package is
// only one way to install them (and the only one that links
// golang-migrate).
//
// Migration bookkeeping lives in pgbaton.schema_migrations. Up and Down are
// safe to run from many processes at once: they serialise on an advisory
// lock. Every file runs as one implicit transaction, so a failed migration
// leaves the schema as it was (golang-migrate still marks the version dirty;
// see ErrDirty).
//
// The schema starts from a baseline, one file per owner, each object
// defined once: 0100_schema, 0101_advisory, 0102_leasetable,
// 0103_fencedwrite, 0104_jobs and 0105_operator (roles, the audit log,
// forced release, retention). A database at a version below the baseline
// was migrated by a pre-release development build and is refused with
// ErrPreRelease, which says how to start again.
//
// From the first release on, migrations are append-only: a change to the
// schema is a new pair of files numbered after the last, and a released
// file is never edited. testdata/catalog.golden is the whole schema as the
// system catalogs describe it; TestCatalogSnapshot fails on any difference,
// so every change to the schema shows in review (regenerate it with
// `go test ./migrations -run TestCatalogSnapshot -update`).
//
// pgbaton refuses a database migrated by a newer build
// (pgbaton.ErrSchemaTooNew) and a standby (pgbaton.ErrStandby). Roles,
// retention and the CLI's `pgbaton migrate` are in [Operating].
//
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/golang-migrate/migrate/v4"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/schema"
)

// files are the migration files, embedded by the root package so that
// services that apply them with their own tool need not import this one.
var files = pgbaton.Migrations()

const (
	// Schema is the Postgres schema that holds every pgbaton object.
	Schema = "pgbaton"
	// Table is golang-migrate's bookkeeping table inside Schema.
	Table = "schema_migrations"
)

// ErrDirty is returned when a previous migration failed half-way, as
// golang-migrate records it. Inspect the schema, then force the version with
// the migrate CLI (`migrate force N`) before running Up again.
var ErrDirty = schema.ErrDirty

// ErrPreRelease is returned, together with pgbaton.ErrNotMigrated, for a
// database migrated by a pre-release development build of pgbaton: its
// schema version is below the baseline this release starts from, and no
// migration leads from it. The error says what to do: drop the schema
// pgbaton and migrate again.
var ErrPreRelease = schema.ErrPreRelease

// Latest is the newest schema version this build of pgbaton knows.
func Latest() uint {
	var latest uint
	entries, _ := fs.ReadDir(files, ".")
	for _, e := range entries {
		if m, err := source.DefaultParse(e.Name()); err == nil && m.Version > latest {
			latest = m.Version
		}
	}
	return latest
}

// FS returns the embedded migration files, for tools that apply them some
// other way: pgbaton.Migrations, which needs no import of this package and
// so none of golang-migrate's dependencies.
func FS() fs.FS { return files }

// Version returns the schema version of the database behind pool and whether
// it is dirty. A database pgbaton never migrated has version 0. It needs only
// read access.
func Version(ctx context.Context, pool *pgxpool.Pool) (version uint, dirty bool, err error) {
	if pool == nil {
		return 0, false, fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	return schema.Version(ctx, pool)
}

// Check reports whether the database is migrated to exactly the version this
// build needs: nil, or an error that wraps pgbaton.ErrNotMigrated,
// pgbaton.ErrSchemaTooNew, ErrDirty or pgbaton.ErrStandby.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	return schema.Check(ctx, pool)
}

// Up applies every migration not yet applied. It refuses a standby and a
// database migrated by a newer pgbaton (pgbaton.ErrSchemaTooNew).
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	return run(ctx, pool, func(m *migrate.Migrate) error { return m.Up() })
}

// Down reverts every migration and then drops the pgbaton schema. It fails,
// changing nothing more, if the schema holds objects pgbaton did not create.
// All locks, leases, runs and fenced values are lost.
func Down(ctx context.Context, pool *pgxpool.Pool) error {
	err := run(ctx, pool, func(m *migrate.Migrate) error { return m.Down() })
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New()
		if err := q.LockMigrations(ctx, tx); err != nil {
			return err
		}
		if err := q.DropSchemaMigrations(ctx, tx); err != nil {
			return err
		}
		if err := q.DropSchema(ctx, tx); err != nil {
			return fmt.Errorf("migrations: drop schema %s (it still holds objects pgbaton did not create?): %w", Schema, err)
		}
		return nil
	})
}

// UpURL, DownURL and VersionURL do the same against a connection string.

// UpURL runs Up against the database at connString.
func UpURL(ctx context.Context, connString string) error {
	return withPool(ctx, connString, func(p *pgxpool.Pool) error { return Up(ctx, p) })
}

// DownURL runs Down against the database at connString.
func DownURL(ctx context.Context, connString string) error {
	return withPool(ctx, connString, func(p *pgxpool.Pool) error { return Down(ctx, p) })
}

// VersionURL runs Version against the database at connString.
func VersionURL(ctx context.Context, connString string) (version uint, dirty bool, err error) {
	err = withPool(ctx, connString, func(p *pgxpool.Pool) error {
		version, dirty, err = Version(ctx, p)
		return err
	})
	return version, dirty, err
}

func withPool(ctx context.Context, connString string, fn func(*pgxpool.Pool) error) error {
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		return fmt.Errorf("%w: connection string: %w", pgbaton.ErrInvalidArgument, err)
	}
	defer pool.Close()
	return fn(pool)
}

func run(ctx context.Context, pool *pgxpool.Pool, step func(*migrate.Migrate) error) error {
	if pool == nil {
		return fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	q := db.New()
	info, err := q.ServerInfo(ctx, pool)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if info.InRecovery {
		return pgbaton.ErrStandby
	}
	if pool.Config().MaxConns < 2 {
		return fmt.Errorf("%w: migrations need a pool of at least 2 connections (one holds the migration lock)", pgbaton.ErrInvalidArgument)
	}
	lockConn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer lockConn.Release()
	if err := q.LockMigrationsSession(ctx, lockConn); err != nil {
		return fmt.Errorf("migrations: take migration lock: %w", err)
	}
	defer func() {
		// A failed unlock leaves the lock on a pooled connection: close it.
		if err := q.UnlockMigrationsSession(context.WithoutCancel(ctx), lockConn); err != nil {
			_ = lockConn.Hijack().Close(context.WithoutCancel(ctx))
		}
	}()
	// golang-migrate's table lives in the schema, so the schema must exist
	// first.
	if err := q.CreateSchema(ctx, lockConn); err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", Schema, err)
	}
	v, dirty, err := Version(ctx, pool)
	if err != nil {
		return err
	}
	if err := schema.CheckVersion(v, dirty); err != nil && (!errors.Is(err, pgbaton.ErrNotMigrated) || errors.Is(err, ErrPreRelease)) {
		return err
	}

	src, err := iofs.New(files, ".")
	if err != nil {
		return fmt.Errorf("migrations: source: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	driver, err := pgxmigrate.WithInstance(sqlDB, &pgxmigrate.Config{SchemaName: Schema, MigrationsTable: Table})
	if err != nil {
		_ = sqlDB.Close()
		return fmt.Errorf("migrations: driver: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("migrations: %w", err)
	}
	defer m.Close()

	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			m.GracefulStop <- true
		case <-done:
		}
	}()
	if _, _, err := m.Version(); errors.Is(err, migrate.ErrNilVersion) && v > 0 {
		// Another tool installed the schema (the files keep their own
		// record): take it over from there instead of applying the files
		// again.
		if err := m.Force(int(v)); err != nil {
			return fmt.Errorf("migrations: record version %d: %w", v, err)
		}
	}
	err = step(m)
	switch {
	case errors.Is(err, migrate.ErrNoChange):
		return nil
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("migrations: stopped: %w (%w)", ctx.Err(), err)
	case err != nil:
		return fmt.Errorf("migrations: %w", err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("migrations: stopped before the last step: %w", ctx.Err())
	}
	return nil
}
