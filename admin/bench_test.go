package admin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/admin/admindb"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// benchFixture fills a database with 1000 leases in 20 groups (half held),
// 100 held advisory locks and 200 job runs, the scale of a busy service.
func benchFixture(b *testing.B) (*pgxpool.Pool, *httptest.Server) {
	b.Helper()
	ctx := context.Background()
	d := env.DB(b)
	pool := d.Pool(b)
	holder := pgtest.Connect(b, d.URL, "bench-holder")
	for _, sql := range []string{
		`SELECT pgbaton.register('group-' || g, array_agg('lease-' || g || '-' || i)) FROM generate_series(1, 20) g, generate_series(1, 50) i GROUP BY g`,
		`SELECT pgbaton.claim('group-' || g, 'worker-' || g, 25, 600000) FROM generate_series(1, 20) g`,
		`SELECT pg_advisory_lock(k) FROM generate_series(1, 100) k`,
		`INSERT INTO pgbaton.job_run (job, owner, token) SELECT 'job-' || i, 'worker', i FROM generate_series(1, 200) i`,
	} {
		_, err := holder.Exec(ctx, sql)
		require.NoError(b, err, sql)
	}
	srv, err := admin.New(pool, admin.Config{AdminToken: testToken})
	require.NoError(b, err)
	ts := httptest.NewServer(srv)
	b.Cleanup(ts.Close)
	return pool, ts
}

// rawMetricQueries is what a scrape costs the database: the same generated
// queries on one connection, without HTTP or the Prometheus encoding.
func rawMetricQueries(ctx context.Context, pool *pgxpool.Pool, topN int32) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	q := admindb.New()
	if _, err := q.AdminAdvisoryStats(ctx, conn); err != nil {
		return err
	}
	if _, err := q.AdminLeaseTotals(ctx, conn); err != nil {
		return err
	}
	if _, err := q.AdminLeaseGroups(ctx, conn, topN); err != nil {
		return err
	}
	if _, err := q.AdminTopLeaseTokens(ctx, conn, topN); err != nil {
		return err
	}
	if _, err := q.LockTableUsage(ctx, conn); err != nil {
		return err
	}
	_, err = q.AdminEventCounts(ctx, conn)
	return err
}

func fetch(b *testing.B, ts *httptest.Server, path string) {
	resp, err := ts.Client().Get(ts.URL + path)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %s", path, resp.Status)
	}
}

// BenchmarkMetricsScrape times a /metrics scrape against its database
// queries run with plain pgx in the same loop; x-raw is the ratio.
func BenchmarkMetricsScrape(b *testing.B) {
	ctx := context.Background()
	pool, ts := benchFixture(b)
	var raw, scrape time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		if err := rawMetricQueries(ctx, pool, 50); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		fetch(b, ts, "/metrics")
		scrape += time.Since(t1)
		raw += t1.Sub(t0)
		n++
	}
	b.ReportMetric(float64(scrape.Microseconds())/float64(n), "scrape-µs/op")
	b.ReportMetric(float64(raw.Microseconds())/float64(n), "raw-µs/op")
	b.ReportMetric(float64(scrape)/float64(raw), "x-raw")
}

// BenchmarkPage times rendering the admin page against its database
// queries run with plain pgx in the same loop; x-raw is the ratio.
func BenchmarkPage(b *testing.B) {
	ctx := context.Background()
	pool, ts := benchFixture(b)
	var raw, page time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		q := admindb.New()
		_, err1 := q.AdminIdentity(ctx, conn)
		_, err2 := q.LockTableUsage(ctx, conn)
		_, err3 := q.AdvisoryLocks(ctx, conn, admindb.AdvisoryLocksParams{MaxRows: 51})
		_, err4 := q.Leases(ctx, conn, admindb.LeasesParams{LeaseState: "held", MaxRows: 51})
		_, err5 := q.LeaseWaiters(ctx, conn, admindb.LeaseWaitersParams{MaxRows: 50})
		_, err6 := q.JobRuns(ctx, conn, admindb.JobRunsParams{MaxRows: 50})
		_, err7 := q.Events(ctx, conn, admindb.EventsParams{MaxRows: 50})
		conn.Release()
		for _, err := range []error{err1, err2, err3, err4, err5, err6, err7} {
			if err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		fetch(b, ts, "/")
		page += time.Since(t1)
		raw += t1.Sub(t0)
		n++
	}
	b.ReportMetric(float64(page.Microseconds())/float64(n), "page-µs/op")
	b.ReportMetric(float64(raw.Microseconds())/float64(n), "raw-µs/op")
	b.ReportMetric(float64(page)/float64(raw), "x-raw")
}
