//go:build ha

package ha

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/internal/testkit/hacluster"
	"github.com/pgbaton/pgbaton/test/check"
)

// primary is one incarnation of a primary: its port and its postmaster's
// start (a primary restarted in place is a new incarnation).
type primary struct {
	Port    int
	Started time.Time
}

func (p primary) same(q primary) bool { return p.Port == q.Port && p.Started.Equal(q.Started) }

// connectPrimary connects to url, giving up after a second.
func connectPrimary(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = time.Second
	cfg.RuntimeParams["application_name"] = "ha-monitor"
	return pgx.ConnectConfig(ctx, cfg)
}

// whoIsPrimary asks url (the multi-host URL, which connects only to a
// primary) who answers.
func whoIsPrimary(ctx context.Context, url string) (primary, error) {
	conn, err := connectPrimary(ctx, url)
	if err != nil {
		return primary{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var p primary
	err = conn.QueryRow(ctx, "SELECT inet_server_port(), pg_postmaster_start_time()").Scan(&p.Port, &p.Started)
	return p, err
}

// failover is what watchFailover measured.
type failover struct {
	Down int64   // MonoNow when the old primary first stopped answering as a primary
	Up   int64   // MonoNow when a new primary first accepted a connection
	New  primary // the new primary
	Err  error
}

// watchFailover connects to the old primary, then, in the background,
// watches it until it stops answering as a primary, and then the cluster
// URL until a different primary answers.
func watchFailover(ctx context.Context, c *hacluster.Cluster, old primary) (<-chan failover, error) {
	conn, err := connectPrimary(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", old.Port))
	if err != nil {
		return nil, fmt.Errorf("connect to the old primary: %w", err)
	}
	out := make(chan failover, 1)
	go func() {
		var f failover
		defer func() { out <- f }()
		defer conn.Close(context.WithoutCancel(ctx))
		for {
			at := check.MonoNow()
			// Generous: a primary busy with the checkpoint a switchover
			// starts with answers slowly, but answers.
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			var standby bool
			err := conn.QueryRow(pctx, "SELECT pg_is_in_recovery()").Scan(&standby)
			cancel()
			if ctx.Err() != nil {
				f.Err = ctx.Err()
				return
			}
			if err != nil || standby {
				f.Down = at
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		for {
			p, err := whoIsPrimary(ctx, c.URL("postgres"))
			if ctx.Err() != nil {
				f.Err = fmt.Errorf("no new primary: %w (last: %v)", ctx.Err(), err)
				return
			}
			if err == nil && !p.same(old) {
				f.Up, f.New = check.MonoNow(), p
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return out, nil
}
