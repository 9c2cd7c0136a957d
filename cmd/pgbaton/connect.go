package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/cmd/pgbaton/internal/opdb"
)

// sqlstateNotFound is pgbaton's own SQLSTATE for "no such lock", raised by
// the schema's release functions; pgerrcode has only PostgreSQL's.
const sqlstateNotFound = "PB404"

// errStandby is the error of a query that reads pgbaton's unlogged tables
// (the lease waiters) on a standby, which cannot.
var errStandby = errors.New("this server is a standby, which cannot read pgbaton's unlogged tables (lease waiters): connect to the primary")

// withPool connects (see connect), warns when the server is a standby,
// runs fn with the pool and closes the pool when fn returns: the one place
// a command opens and closes its connections.
func (g *globals) withPool(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	pool, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := g.warnIfStandby(ctx, pool); err != nil {
		return err
	}
	return fn(pool)
}

// warnIfStandby says so on stderr when the server is a standby: its
// pg_locks holds only the standby's own sessions' locks (none of the
// primary's), and its leases lag the primary's, so a view of it would
// otherwise look empty or stale without a word.
func (g *globals) warnIfStandby(ctx context.Context, pool *pgxpool.Pool) error {
	info, err := opdb.New().ServerStatus(ctx, pool)
	if err != nil {
		return explainQueryError(err)
	}
	if info.InRecovery {
		fmt.Fprintln(g.stderr, "pgbaton: warning: connected to a standby (pg_is_in_recovery): it shows none of the primary's advisory locks, "+
			"its leases lag the primary's, and nothing can be released here; connect to the primary (e.g. PGTARGETSESSIONATTRS=read-write)")
	}
	return nil
}

// connect opens a pool and checks that the server answers, turning the
// usual failures into one actionable line.
func (g *globals) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(g.connString())
	if err != nil {
		return nil, usageError{fmt.Errorf("bad connection string: %w", err)}
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" { // PGAPPNAME or the DSN win
		cfg.ConnConfig.RuntimeParams["application_name"] = "pgbaton-cli"
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, explainConnectError(cfg, err)
	}
	return pool, nil
}

func explainConnectError(cfg *pgxpool.Config, err error) error {
	where := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InvalidCatalogName:
		return fmt.Errorf("database %q does not exist on %s: check the connection (pgbaton help environment)", cfg.ConnConfig.Database, where)
	case errors.As(err, &pgErr) && pgerrcode.IsInvalidAuthorizationSpecification(pgErr.Code):
		return fmt.Errorf("authentication failed for user %q on %s: check the credentials (pgbaton help environment)", cfg.ConnConfig.User, where)
	case errors.As(err, &netErr), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("cannot reach PostgreSQL at %s (%s): is the server running? Set --dsn, PGBATON_DSN, DATABASE_URL or PGHOST (pgbaton help environment)", where, rootCause(err))
	}
	return fmt.Errorf("connect to %s: %w", where, err)
}

// rootCause is a one-line cause: pgx's connect errors list every address
// tried over several lines.
func rootCause(err error) string {
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return opErr.Err.Error()
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// explainQueryError turns the errors an operator can fix into one line that
// says how.
func explainQueryError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case pgerrcode.UndefinedTable, pgerrcode.InvalidSchemaName, pgerrcode.UndefinedFunction:
		return fmt.Errorf("the pgbaton schema is missing or too old in this database (%s): run `pgbaton migrate up`", pgErr.Message)
	case pgerrcode.InsufficientPrivilege:
		msg := pgErr.Message
		if pgErr.Hint != "" {
			msg += " (" + pgErr.Hint + ")"
		} else {
			msg += ": grant the role pgbaton_reader (to inspect) or pgbaton_admin (to release)"
		}
		return errors.New(msg)
	case pgerrcode.FeatureNotSupported:
		if strings.Contains(pgErr.Message, "during recovery") {
			return errStandby
		}
	case sqlstateNotFound:
		return fmt.Errorf("%w: %s", errNotFound, pgErr.Message)
	}
	return err
}
