package pgbaton

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns pgbaton's schema as migration files for whichever tool
// a service already runs (golang-migrate in its own pipeline, goose, tern,
// Atlas, dbmate): NNNN_name.up.sql and NNNN_name.down.sql, applied in the
// order of NNNN, each file in one transaction. Every file records the
// schema's version in pgbaton.schema_version as its last statement, which
// is what the library checks, so any tool will do; use one per database.
// Recipes, tested for golang-migrate, goose and tern, are in
// docs/operating.md. Unlike package migrations, which applies the same
// files with golang-migrate, this adds no dependency to a service's build.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the pattern above is a constant
	}
	return sub
}
