package fencedwrite_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

// A COMMIT reaches the old primary and commits there, its reply is lost,
// and the pool's next connection reaches a standby that was promoted
// before that commit replicated (an asynchronous failover that lost WAL).
// On the new timeline the same transaction id belongs to another
// transaction, which committed: txid_status says "committed" about a write
// that is gone. InTx must not believe it: it answers only from the
// timeline the transaction ran on, and says ErrCommitUnknown otherwise.
func TestInTxCommitUnknownAfterLossyPromotion(t *testing.T) {
	ctx := testContext(t)
	oldPrimary := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	url := oldPrimary.URL("postgres")
	require.NoError(t, migrations.UpURL(ctx, url))
	direct := pgtest.Pool(t, url)
	_, err := direct.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)")
	require.NoError(t, err)
	lease := fencedwrite.Token("job:a", acquire(t, ctx, direct, "job:a", "me", time.Hour))

	// The standby has the table and the lease, then is promoted: from
	// here the two servers' histories diverge.
	standby := pgtest.NewStandby(t, oldPrimary)
	newPrimary := pgtest.Pool(t, standby.URL("postgres"))
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var n int
		err := newPrimary.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE name = 'job:a' AND owner IS NOT NULL").Scan(&n)
		return err == nil && n == 1, nil
	}, "the standby did not replay the lease")
	_, err = newPrimary.Exec(ctx, "SELECT pg_promote(true, 60)")
	require.NoError(t, err)

	// InTx's pool dials through target: the old primary (through a proxy
	// that can lose the COMMIT's reply), later the new one.
	proxy, err := faultproxy.New(net.JoinHostPort("127.0.0.1", strconv.Itoa(oldPrimary.Port())))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	var target atomic.Value
	target.Store(proxy.Addr())
	pool := pgtest.Pool(t, url, func(c *pgxpool.Config) {
		c.ConnConfig.DialFunc = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", target.Load().(string))
		}
	})

	done := make(chan error, 1)
	go func() {
		done <- fencedwrite.InTx(ctx, pool, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)")
			// The COMMIT reaches the server late, its reply later still.
			proxy.SetLatency(3 * time.Second)
			return err
		})
	}()
	var xid int64
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		err := direct.QueryRow(ctx, "SELECT xmin::text::bigint FROM t").Scan(&xid)
		return err == nil, nil
	}, "the transaction did not commit on the old primary")
	// The new primary hands the same transaction id to a transaction of
	// its own, which commits.
	for {
		var next int64
		require.NoError(t, newPrimary.QueryRow(ctx, "SELECT txid_current()").Scan(&next))
		if next >= xid {
			break
		}
	}
	var status string
	require.NoError(t, newPrimary.QueryRow(ctx, "SELECT txid_status($1)", xid).Scan(&status))
	require.Equal(t, "committed", status, "the new timeline committed another transaction with id %d", xid)

	target.Store(net.JoinHostPort("127.0.0.1", strconv.Itoa(standby.Port())))
	proxy.Cut() // the reply is still held back: it is lost
	proxy.SetLatency(0)
	select {
	case err := <-done:
		require.ErrorIs(t, err, fencedwrite.ErrCommitUnknown,
			"the write is not on the new primary; InTx must not report it committed")
	case <-time.After(30 * time.Second):
		t.Fatal("InTx did not return")
	}
	require.Zero(t, rowCount(t, ctx, newPrimary), "the write is indeed lost on the new primary")
}
