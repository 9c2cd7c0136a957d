package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/migrations"
)

// Set by the release build (goreleaser's ldflags: -X main.version=...
// -X main.commit=... -X main.date=...). Without them, version and commit
// come from the binary's build info: the module version for `go install
// ...@vX.Y.Z`, the VCS revision for a build in a checkout.
var (
	version = ""
	commit  = ""
	date    = ""
)

// libraryModule is the library's module path, whose version the CLI was
// built against.
const libraryModule = "github.com/pgbaton/pgbaton"

// versionReport is what `pgbaton version` shows.
type versionReport struct {
	Version        string           `json:"version"`
	Commit         string           `json:"commit,omitempty"`
	BuiltAt        string           `json:"built_at,omitempty"`
	GoVersion      string           `json:"go_version"`
	Platform       string           `json:"platform"`
	Library        string           `json:"library_version"`
	SchemaVersion  uint             `json:"schema_version"` // the newest migration this build knows
	ConnectedTo    *databaseVersion `json:"database,omitempty"`
	databaseFailed error
}

// databaseVersion is the connected database's side of `pgbaton version`.
type databaseVersion struct {
	SchemaVersion uint   `json:"schema_version"`
	Dirty         bool   `json:"dirty"`
	ServerVersion string `json:"server_version"`
}

func buildVersion() versionReport {
	rep := versionReport{Version: version, Commit: commit, BuiltAt: date, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Library: "unknown", SchemaVersion: migrations.Latest()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if rep.Version == "" {
			rep.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && rep.Commit == "" {
				rep.Commit = s.Value
			}
			if s.Key == "vcs.modified" && s.Value == "true" && rep.Commit != "" && commit == "" {
				rep.Commit += "-dirty"
			}
		}
		for _, d := range bi.Deps {
			if d.Path == libraryModule {
				rep.Library = d.Version
				if d.Replace != nil {
					rep.Library = d.Replace.Version
				}
				if rep.Library == "" {
					rep.Library = "(devel)"
				}
			}
		}
	}
	if rep.Version == "" {
		rep.Version = "(devel)"
	}
	return rep
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the CLI's version, commit and Go version, and the database's schema version when connected",
		Long: `Print the CLI's version (its module version, or the release's), the commit
it was built from, the Go release and platform, the library version it links
and the newest schema version it knows. With a connection string (--dsn,
PGBATON_DSN or DATABASE_URL) it also prints the connected database's schema
version and server version, and fails if it cannot connect.`,
		Example: `  pgbaton version
  pgbaton version --dsn postgres://oncall@db1/app -o json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep := buildVersion()
			if g.connString() != "" {
				rep.databaseFailed = g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
					v, dirty, err := migrations.Version(cmd.Context(), pool)
					if err != nil {
						return explainQueryError(err)
					}
					var server string
					if err := pool.QueryRow(cmd.Context(), "SELECT current_setting('server_version')").Scan(&server); err != nil {
						return explainQueryError(err)
					}
					rep.ConnectedTo = &databaseVersion{SchemaVersion: v, Dirty: dirty, ServerVersion: server}
					return nil
				})
			}
			err := g.render(rep, []string{"FIELD", "VALUE"}, func() [][]string {
				rows := [][]string{
					{"version", rep.Version},
					{"commit", orDash(rep.Commit)},
				}
				if rep.BuiltAt != "" {
					rows = append(rows, []string{"built", rep.BuiltAt})
				}
				rows = append(rows,
					[]string{"go", rep.GoVersion + " " + rep.Platform},
					[]string{"library", rep.Library},
					[]string{"schema (this build)", fmt.Sprint(rep.SchemaVersion)})
				if d := rep.ConnectedTo; d != nil {
					dirty := ""
					if d.Dirty {
						dirty = " (dirty: a migration failed half-way)"
					}
					rows = append(rows, []string{"schema (database)", fmt.Sprint(d.SchemaVersion) + dirty},
						[]string{"server", d.ServerVersion})
				}
				return rows
			})
			if rep.databaseFailed != nil {
				return fmt.Errorf("the database's schema version: %w", rep.databaseFailed)
			}
			return err
		},
	}
}
