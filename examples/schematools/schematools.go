// Package schematools installs pgbaton's schema with the migration tool a
// service already runs, from pgbaton.Migrations(): golang-migrate (its
// iofs source, nothing here), goose and tern. Each recipe is a few lines
// to copy; schematools_test.go applies the schema with each tool to a
// real server and then uses the library against it.
//
// Whichever tool it is, the files keep the schema's own version record
// (pgbaton.schema_version), which the library checks: use one tool per
// database, and apply a new release's new files with it before starting
// that release.
package schematools

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
	"github.com/pressly/goose/v3"

	"github.com/pgbaton/pgbaton"
)

// File is one of pgbaton's migrations: its version (NNNN of the file name)
// and the SQL of its up and down files.
type File struct {
	Version  int64
	Name     string
	Up, Down string
}

// Files reads pgbaton.Migrations() in the order they apply.
func Files() ([]File, error) {
	fsys := pgbaton.Migrations()
	ups, err := fs.Glob(fsys, "*.up.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(ups)
	var files []File
	for _, up := range ups {
		name := strings.TrimSuffix(up, ".up.sql")
		num, _, _ := strings.Cut(name, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("schematools: %s: no version number: %w", up, err)
		}
		upSQL, err := fs.ReadFile(fsys, up)
		if err != nil {
			return nil, err
		}
		downSQL, err := fs.ReadFile(fsys, name+".down.sql")
		if err != nil {
			return nil, err
		}
		files = append(files, File{Version: v, Name: name, Up: string(upSQL), Down: string(downSQL)})
	}
	return files, nil
}

// GooseMigrations are pgbaton's files as goose Go migrations, each file
// run whole in goose's transaction (goose's SQL files would need its
// annotations), for goose.NewProvider(goose.DialectPostgres, db, nil,
// goose.WithGoMigrations(migrations...)). Keep goose's versions for
// pgbaton apart from your own: give pgbaton a provider and version table
// of its own (goose.WithTableName).
func GooseMigrations() ([]*goose.Migration, error) {
	files, err := Files()
	if err != nil {
		return nil, err
	}
	run := func(stmt string) *goose.GoFunc {
		return &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, stmt)
			return err
		}}
	}
	var ms []*goose.Migration
	for _, f := range files {
		ms = append(ms, goose.NewGoMigration(f.Version, run(f.Up), run(f.Down)))
	}
	return ms, nil
}

// TernMigrator is a tern migrator holding pgbaton's files, its version
// table versionTable (keep it apart from your own migrations'). Each file
// runs whole in tern's transaction.
func TernMigrator(ctx context.Context, conn *pgx.Conn, versionTable string) (*migrate.Migrator, error) {
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return nil, err
	}
	files, err := Files()
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		m.AppendMigration(f.Name, f.Up, f.Down)
	}
	return m, nil
}
