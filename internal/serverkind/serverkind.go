package serverkind

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
)

// Kind is the kind of server behind a connection.
type Kind int

const (
	// PostgreSQL, or a server derived from it that keeps its locking and
	// sequence semantics.
	PostgreSQL Kind = iota
	// CockroachDB: advisory locks are no-ops.
	CockroachDB
	// YugabyteDB: sequences are cached per connection.
	YugabyteDB
)

func (k Kind) String() string {
	switch k {
	case CockroachDB:
		return "CockroachDB"
	case YugabyteDB:
		return "YugabyteDB"
	}
	return "PostgreSQL"
}

// Classify tells the kind from the server's version() string and its
// startup parameters (param returns "" for a parameter the server did not
// send; nil means none are known).
func Classify(version string, param func(name string) string) Kind {
	if param == nil {
		param = func(string) string { return "" }
	}
	switch {
	case param("crdb_version") != "", strings.Contains(version, "CockroachDB"):
		return CockroachDB
	case strings.Contains(param("server_version"), "-YB-"), strings.Contains(version, "-YB-"):
		return YugabyteDB
	}
	return PostgreSQL
}

// Err is nil for PostgreSQL and otherwise an error wrapping
// pgbaton.ErrUnsupportedServer that says why the server is refused.
// version is quoted in the message when known.
func (k Kind) Err(version string) error {
	var why string
	switch k {
	case CockroachDB:
		why = "CockroachDB's pg_advisory_lock returns at once without locking anything, so locks would not exclude each other"
	case YugabyteDB:
		why = "YugabyteDB caches sequence values per connection, so fencing tokens would not grow across clients"
	default:
		return nil
	}
	if version != "" {
		return fmt.Errorf("%w: %s (%q): %s; use PostgreSQL", pgbaton.ErrUnsupportedServer, k, version, why)
	}
	return fmt.Errorf("%w: %s: %s; use PostgreSQL", pgbaton.ErrUnsupportedServer, k, why)
}

// FromParams classifies conn by the startup parameters it received, without
// a round trip. PostgreSQL means "not known to be anything else".
func FromParams(conn *pgx.Conn) Kind {
	return Classify("", conn.PgConn().ParameterStatus)
}

// CheckConn refuses a connection to a server that is not PostgreSQL: it
// looks at the startup parameters and asks version() with the simple
// protocol (no prepared statement, which a transaction pooler might
// mishandle).
func CheckConn(ctx context.Context, conn *pgx.Conn) error {
	if k := FromParams(conn); k != PostgreSQL {
		return k.Err(conn.PgConn().ParameterStatus("crdb_version"))
	}
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()", pgx.QueryExecModeSimpleProtocol).Scan(&version); err != nil {
		return fmt.Errorf("pgbaton: ask the server's version: %w", err)
	}
	return Classify(version, conn.PgConn().ParameterStatus).Err(version)
}

// Check is CheckConn on a connection from pool. leasetable.New and other
// entry points that start on a pool call it once.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgbaton: connect: %w", err)
	}
	defer c.Release()
	return CheckConn(ctx, c.Conn())
}
