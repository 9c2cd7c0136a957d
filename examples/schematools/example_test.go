package schematools_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/examples/schematools"
	"github.com/pgbaton/pgbaton/migrations"
)

// accepted says whether the library accepts the schema at url.
func accepted(ctx context.Context, url string) string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var v uint
	if err := conn.QueryRow(ctx, "SELECT version FROM pgbaton.schema_version").Scan(&v); err != nil {
		log.Fatal(err)
	}
	if v != migrations.Latest() {
		return fmt.Sprintf("schema at %d, the library needs %d", v, migrations.Latest())
	}
	return "the library accepts the schema"
}

// golang-migrate, in your own pipeline: pgbaton's files as an iofs source,
// with a version table of their own.
func Example_golangMigrate() {
	url, done := env.ExampleEmptyDB()
	defer done()
	dbURL := strings.Replace(url, "postgres://", "pgx5://", 1) + "&x-migrations-table=pgbaton_migrations"

	src, err := iofs.New(pgbaton.Migrations(), ".")
	if err != nil {
		log.Fatal(err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		log.Fatal(err)
	}

	fmt.Println(accepted(context.Background(), url))
	// Output: the library accepts the schema
}

// goose: each file a Go migration, run whole in goose's transaction.
func ExampleGooseMigrations() {
	url, done := env.ExampleEmptyDB()
	defer done()
	ctx := context.Background()
	db, err := goose.OpenDBWithDriver("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ms, err := schematools.GooseMigrations()
	if err != nil {
		log.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithGoMigrations(ms...), goose.WithTableName("goose_pgbaton"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		log.Fatal(err)
	}

	fmt.Println(accepted(ctx, url))
	// Output: the library accepts the schema
}

// tern: the files appended to a migrator with a version table of its own.
func ExampleTernMigrator() {
	url, done := env.ExampleEmptyDB()
	defer done()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)

	m, err := schematools.TernMigrator(ctx, conn, "tern_pgbaton")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	fmt.Println(accepted(ctx, url))
	// Output: the library accepts the schema
}
