package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connect opens a pool and checks that the server answers, turning the
// usual failures into one actionable line.
func (g *globals) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(g.connString())
	if err != nil {
		return nil, usageError{fmt.Errorf("bad connection string: %w", err)}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgbaton-cli"
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
	case errors.As(err, &pgErr) && pgErr.Code == "3D000":
		return fmt.Errorf("database %q does not exist on %s: check --dsn or DATABASE_URL", cfg.ConnConfig.Database, where)
	case errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000"):
		return fmt.Errorf("authentication failed for user %q on %s: check the credentials in --dsn or DATABASE_URL", cfg.ConnConfig.User, where)
	case errors.As(err, &netErr), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("cannot reach PostgreSQL at %s (%s): is the server running? Set --dsn or DATABASE_URL", where, rootCause(err))
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
	case "42P01", "3F000", "42883": // undefined table, schema, function
		return fmt.Errorf("the pgbaton schema is missing or too old in this database (%s): run `pgbaton migrate up`", pgErr.Message)
	case "42501": // insufficient privilege
		msg := pgErr.Message
		if pgErr.Hint != "" {
			msg += " (" + pgErr.Hint + ")"
		} else {
			msg += ": grant the role pgbaton_reader (to inspect) or pgbaton_admin (to release)"
		}
		return errors.New(msg)
	case "PB404":
		return fmt.Errorf("%w: %s", errNotFound, pgErr.Message)
	}
	return err
}
