package main

import "github.com/spf13/cobra"

// The CLI's own environment variables; `pgbaton help environment` is where
// they, and the libpq ones it honours, are documented.
const (
	envDSN        = "PGBATON_DSN"
	envOutput     = "PGBATON_OUTPUT"
	envAdminToken = "PGBATON_ADMIN_TOKEN"
)

// environmentHelp is the one place the CLI's environment is documented
// (the README's CLI section repeats it).
const environmentHelp = `pgbaton connects with the first of:

  --dsn               a connection string: postgres://user@host:5432/db?sslmode=verify-full
                      or key=value pairs: "host=db1 user=oncall dbname=app"
  PGBATON_DSN         the same, for pgbaton only
  DATABASE_URL        the same, shared with your application's tooling
  the libpq variables what is left unset in the connection string

The libpq variables (as psql reads them; pgx implements them):

  PGHOST PGPORT PGDATABASE PGUSER PGPASSWORD PGPASSFILE (~/.pgpass)
  PGSERVICE PGSERVICEFILE (~/.pg_service.conf)
  PGSSLMODE PGSSLCERT PGSSLKEY PGSSLROOTCERT PGSSLPASSWORD PGSSLSNI
  PGCONNECT_TIMEOUT (default here: 10 s)  PGAPPNAME (default here: pgbaton-cli)
  PGTARGETSESSIONATTRS (read-write finds the primary among several hosts)
  PGOPTIONS PGTZ

pgbaton's own:

  PGBATON_OUTPUT       default for -o: table, wide, json or yaml
  PGBATON_ADMIN_TOKEN  pgbaton serve: the token that enables releases on the
                       admin page (better than --admin-token, which ps shows)
  NO_COLOR             any value: no colour, even on a terminal (no-color.org)

Colour and cursor control (pgbaton watch) are used only when standard output
is a terminal; a question is asked only when standard input is one, and
otherwise the command fails with "pass --yes".`

func newEnvironmentTopic() *cobra.Command {
	return &cobra.Command{
		Use:   "environment",
		Short: "Environment variables pgbaton reads: connection (PG*, PGBATON_DSN, DATABASE_URL), output, admin token",
		Long:  environmentHelp,
	}
}

// connString resolves the connection string: --dsn, PGBATON_DSN,
// DATABASE_URL, or empty (pgx then reads the PG* variables).
func (g *globals) connString() string {
	if g.dsn != "" {
		return g.dsn
	}
	if v := g.getenv(envDSN); v != "" {
		return v
	}
	return g.getenv("DATABASE_URL")
}
