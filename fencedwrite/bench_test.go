package fencedwrite_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/migrations"
)

// A guarded single-row update against the same update unguarded, in the
// same run, on the same connections, alternating one by one so that other
// load on the machine hits both alike. Reported: median latency of each and
// the guard's overhead in percent of the unguarded latency, at the median
// and on the mean (target: at most 15).
//
//   - stmt: one autocommit statement, UPDATE ... WHERE id = $1, against the
//     same with AND pgbaton.assert_token($2, $3): the fence costs no extra
//     round trip.
//   - tx: pgx.BeginFunc with the UPDATE, against fencedwrite.InTx with the
//     same UPDATE: the guard is one more round trip in the transaction.
//   - stmt-shared: like stmt, but all clients guard with the same lease
//     (several FOR SHARE lockers of one row make a MultiXact).
//
// BenchmarkGuardedUpdate uses the test binary's cluster (fsync off);
// BenchmarkGuardedUpdateDurable starts a durable one, where every commit
// waits for the WAL flush as in production.

func BenchmarkGuardedUpdate(b *testing.B) {
	benchGuarded(b, env.DB(b).URL)
}

func BenchmarkGuardedUpdateDurable(b *testing.B) {
	c := pgtest.NewCluster(b, pgcluster.Config{})
	url := c.URL("postgres")
	if err := migrations.UpURL(context.Background(), url); err != nil {
		b.Fatal(err)
	}
	benchGuarded(b, url)
}

func benchGuarded(b *testing.B, url string) {
	ctx := context.Background()
	pool := pgtest.Pool(b, url)
	const maxClients = 8
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS bench;
		CREATE TABLE bench (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
		INSERT INTO bench (id) SELECT generate_series(0, 7)`); err != nil {
		b.Fatal(err)
	}
	leases := make([]fencedwrite.Lease, maxClients)
	for i := range leases {
		name := fmt.Sprintf("bench:%d", i)
		var token int64
		if err := pool.QueryRow(ctx, "SELECT token FROM pgbaton.try_acquire($1, 'bench', 3600000)", name).Scan(&token); err != nil {
			b.Fatal(err)
		}
		leases[i] = fencedwrite.Token(name, token)
	}
	conns := make([]*pgx.Conn, maxClients)
	for i := range conns {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close(ctx) })
		conns[i] = conn
	}

	update := func(conn *pgx.Conn, id int) error {
		tag, err := conn.Exec(ctx, "UPDATE bench SET v = v + 1 WHERE id = $1", id)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("updated %d rows", tag.RowsAffected())
		}
		return err
	}
	guardedStmt := func(conn *pgx.Conn, id int, lease fencedwrite.Lease) error {
		tag, err := conn.Exec(ctx, "UPDATE bench SET v = v + 1 WHERE id = $1 AND pgbaton.assert_token($2, $3)",
			id, lease.Name(), lease.Token())
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("updated %d rows", tag.RowsAffected())
		}
		return fencedwrite.MapError(err)
	}
	inTx := func(conn *pgx.Conn, id int) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE bench SET v = v + 1 WHERE id = $1", id)
			return err
		})
	}
	guardedTx := func(conn *pgx.Conn, id int, lease fencedwrite.Lease) error {
		return fencedwrite.InTx(ctx, conn, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE bench SET v = v + 1 WHERE id = $1", id)
			return err
		})
	}

	type kind struct {
		name      string
		raw       func(*pgx.Conn, int) error
		guarded   func(*pgx.Conn, int, fencedwrite.Lease) error
		oneLease  bool
		onlyMulti bool
	}
	kinds := []kind{
		{name: "stmt", raw: update, guarded: guardedStmt},
		{name: "tx", raw: inTx, guarded: guardedTx},
		{name: "stmt-shared", raw: update, guarded: guardedStmt, oneLease: true, onlyMulti: true},
	}
	for _, clients := range []int{1, maxClients} {
		for _, k := range kinds {
			if k.onlyMulti && clients == 1 {
				continue
			}
			b.Run(fmt.Sprintf("%s/clients=%d", k.name, clients), func(b *testing.B) {
				var mu sync.Mutex
				var guarded, raw []time.Duration
				var wg sync.WaitGroup
				per := max(1, b.N/clients)
				b.ResetTimer()
				for c := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						conn, lease := conns[c], leases[c]
						if k.oneLease {
							lease = leases[0]
						}
						g := make([]time.Duration, 0, per)
						r := make([]time.Duration, 0, per)
						for i := range per {
							// Alternate, and swap which goes first, so that
							// neither side always follows the other.
							first, second := func() error { return k.guarded(conn, c, lease) }, func() error { return k.raw(conn, c) }
							firstTimes, secondTimes := &g, &r
							if i%2 == 1 {
								first, second, firstTimes, secondTimes = second, first, secondTimes, firstTimes
							}
							start := time.Now()
							if err := first(); err != nil {
								b.Error(err)
								return
							}
							mid := time.Now()
							if err := second(); err != nil {
								b.Error(err)
								return
							}
							*firstTimes = append(*firstTimes, mid.Sub(start))
							*secondTimes = append(*secondTimes, time.Since(mid))
						}
						mu.Lock()
						guarded = append(guarded, g...)
						raw = append(raw, r...)
						mu.Unlock()
					}()
				}
				wg.Wait()
				b.StopTimer()
				if len(guarded) == 0 || len(raw) == 0 {
					return
				}
				gMean, gMedian := stats(guarded)
				rMean, rMedian := stats(raw)
				b.ReportMetric(gMedian, "guarded-p50-µs")
				b.ReportMetric(rMedian, "raw-p50-µs")
				b.ReportMetric(100*(gMedian/rMedian-1), "overhead-p50-%")
				b.ReportMetric(100*(gMean/rMean-1), "overhead-mean-%")
			})
		}
	}
}

// stats returns the mean and the median of ds in microseconds. The median
// is the figure to quote: load elsewhere on the machine moves the mean.
func stats(ds []time.Duration) (mean, median float64) {
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return us(sum) / float64(len(ds)), us(ds[len(ds)/2])
}
