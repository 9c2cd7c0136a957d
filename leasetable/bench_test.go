package leasetable_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// Benchmarks run on their own durable cluster (fsync and
// synchronous_commit on), and compare the library with raw pgx running the
// same SQL in the same run, alternating phases to share the noise:
//
//	raw:   the protocol functions called directly (what the library sends)
//	plain: hand-written single statements without NOTIFY or plpgsql, what
//	       an application might write without pgbaton

func durablePool(b *testing.B, maxConns int) *pgxpool.Pool {
	b.Helper()
	c := pgtest.NewCluster(b, pgcluster.Config{})
	ctx := context.Background()
	if err := migrations.UpURL(ctx, c.URL("postgres")); err != nil {
		b.Fatal(err)
	}
	return pgtest.Pool(b, c.URL("postgres"), func(cfg *pgxpool.Config) {
		cfg.MaxConns = int32(maxConns)
		cfg.MinConns = int32(maxConns)
	})
}

func benchClient(b *testing.B, pool *pgxpool.Pool, cfg leasetable.Config) *leasetable.Client {
	b.Helper()
	c, err := leasetable.New(context.Background(), pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// compareRounds runs rounds rounds; in each, every variant (in an order
// that rotates between rounds) is set up, then does perRound items with
// workers goroutines, or until its op finds nothing left. It reports each
// variant's median rate over the rounds and the median of the per-round
// ratios of the first variant's rate to each other's: the machine is
// shared and noisy, and medians of adjacent phases resist that best.
func compareRounds(b *testing.B, rounds, workers, perRound int, unit string, variants []variant) {
	b.Helper()
	rates := make([][]float64, len(variants))
	for r := range max(rounds, 1) {
		round := make([]float64, len(variants))
		for k := range variants {
			i := (k + r) % len(variants)
			v := variants[i]
			if v.setup != nil {
				b.StopTimer()
				v.setup()
				b.StartTimer()
			}
			var done atomic.Int64
			var failed atomic.Value
			start := time.Now()
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done.Load() < int64(perRound) {
						c, err := v.op(w)
						if err != nil {
							failed.Store(err)
							return
						}
						if c == 0 { // nothing left
							return
						}
						done.Add(int64(c))
					}
				}()
			}
			wg.Wait()
			took := time.Since(start)
			if err, _ := failed.Load().(error); err != nil {
				b.Fatalf("%s round %d: %v", v.name, r, err)
			}
			round[i] = float64(done.Load()) / took.Seconds()
		}
		for i := range variants {
			rates[i] = append(rates[i], round[i])
		}
	}
	for i, v := range variants {
		b.ReportMetric(median(rates[i]), v.name+"_"+unit+"/s")
		if i > 0 {
			ratios := make([]float64, len(rates[0]))
			for r := range ratios {
				ratios[r] = rates[0][r] / rates[i][r]
			}
			b.ReportMetric(median(ratios), variants[0].name+"/"+v.name)
		}
	}
	b.ReportMetric(0, "ns/op")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type variant struct {
	name  string
	setup func()
	// op does one unit of work on worker w and says how many items it
	// handled (0: nothing left).
	op func(w int) (int, error)
}

func BenchmarkAcquireRelease(b *testing.B) {
	pool := durablePool(b, 10)
	ctx := context.Background()
	c := benchClient(b, pool, leasetable.Config{Owner: "bench", TTL: time.Minute})
	for _, workers := range []int{1, 8} {
		b.Run("conns="+strconv.Itoa(workers), func(b *testing.B) {
			names := make([]string, workers)
			for w := range names {
				names[w] = fmt.Sprintf("cycle-%d-%d", workers, w)
			}
			compareRounds(b, 10, workers, max(b.N/10, 1), "cycles", []variant{
				{name: "lib", op: func(w int) (int, error) {
					l, err := c.TryAcquire(ctx, names[w])
					if err != nil {
						return 0, err
					}
					return 1, l.Release(ctx)
				}},
				{name: "raw", op: func(w int) (int, error) {
					var ok bool
					var tok int64
					var exp, now time.Time
					var holder string
					err := pool.QueryRow(ctx, "SELECT acquired, token, expires_at, holder, db_now FROM pgbaton.lease_attempt($1, $2, $3, NULL)",
						names[w], "raw", int64(60000)).Scan(&ok, &tok, &exp, &holder, &now)
					if err != nil || !ok {
						return 0, fmt.Errorf("raw acquire: %v %v", ok, err)
					}
					return 1, pool.QueryRow(ctx, "SELECT released FROM pgbaton.release($1, $2, $3)", names[w], "raw", tok).Scan(&ok)
				}},
				{name: "plain", op: func(w int) (int, error) {
					var tok int64
					err := pool.QueryRow(ctx, `
INSERT INTO pgbaton.lease AS l (name, owner, token, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, nextval('pgbaton.lease_token_seq'), clock_timestamp(), clock_timestamp(), clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token, acquired_at = excluded.acquired_at,
       renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
RETURNING token`, names[w]+"-plain", "plain", int64(60000)).Scan(&tok)
					if err != nil {
						return 0, err
					}
					_, err = pool.Exec(ctx, "UPDATE pgbaton.lease SET owner = NULL, expires_at = NULL WHERE name = $1 AND owner = $2 AND token = $3",
						names[w]+"-plain", "plain", tok)
					return 1, err
				}},
			})
		})
	}
}

func BenchmarkClaimComplete(b *testing.B) {
	pool := durablePool(b, 12)
	ctx := context.Background()
	const rows = 10000
	fill := func(group string) func() {
		return func() {
			_, err := pool.Exec(ctx, `DELETE FROM pgbaton.lease WHERE lease_group = $1;
				`, group)
			if err == nil {
				_, err = pool.Exec(ctx, `INSERT INTO pgbaton.lease (name, lease_group)
					SELECT $1 || '-' || g, $1 FROM generate_series(1, $2::int) g`, group, rows)
			}
			if err == nil {
				_, err = pool.Exec(ctx, "VACUUM ANALYZE pgbaton.lease")
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, batch := range []int{1, 10, 100} {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("rows=10k/batch=%d/workers=%d", batch, workers), func(b *testing.B) {
				clients := make([]*leasetable.Client, workers)
				for w := range clients {
					clients[w] = benchClient(b, pool, leasetable.Config{Owner: "w" + strconv.Itoa(w), TTL: time.Minute})
				}
				lib := func(w int) (int, error) {
					ls, err := clients[w].Claim(ctx, "lib", batch)
					if err != nil || len(ls) == 0 {
						return 0, err
					}
					return len(ls), clients[w].Complete(ctx, ls...)
				}
				raw := func(w int) (int, error) {
					owner := "raw" + strconv.Itoa(w)
					return claimThenDelete(ctx, pool, owner, "SELECT name, token FROM pgbaton.claim($1, $2, $3, 60000)", "raw", owner, batch)
				}
				plain := func(w int) (int, error) {
					owner := "plain" + strconv.Itoa(w)
					return claimThenDelete(ctx, pool, owner, `
UPDATE pgbaton.lease SET owner = $2, token = nextval('pgbaton.lease_token_seq'), acquired_at = clock_timestamp(),
       renewed_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 minute'
 WHERE name IN (SELECT name FROM pgbaton.lease WHERE lease_group = $1 AND owner IS NULL LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING name, token`, "plain", owner, batch)
				}
				perRound := map[int]int{1: 1500, 10: 5000, 100: rows}[batch]
				compareRounds(b, b.N, workers, perRound, "items", []variant{
					{name: "lib", setup: fill("lib"), op: lib},
					{name: "raw", setup: fill("raw"), op: raw},
					{name: "plain", setup: fill("plain"), op: plain},
				})
			})
		}
	}
}

// claimThenDelete runs a claiming query returning (name, token) rows,
// then deletes what it got in one statement, as the raw variants of the
// claim benchmark do.
func claimThenDelete(ctx context.Context, pool *pgxpool.Pool, owner, sql string, args ...any) (int, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	var names []string
	var toks []int64
	for rows.Next() {
		var n string
		var t int64
		if err := rows.Scan(&n, &t); err != nil {
			return 0, err
		}
		names, toks = append(names, n), append(toks, t)
	}
	if err := rows.Err(); err != nil || len(names) == 0 {
		return 0, err
	}
	_, err = pool.Exec(ctx, "DELETE FROM pgbaton.lease WHERE name = ANY ($1) AND token = ANY ($2) AND owner = $3", names, toks, owner)
	return len(names), err
}

// BenchmarkHandover measures from the holder's release call to the
// waiter's acquire returning, for the library and for raw pgx doing the
// same protocol (a LISTEN connection, wait_for, lease_attempt, release),
// alternating.
func BenchmarkHandover(b *testing.B) {
	pool := durablePool(b, 6)
	ctx := context.Background()
	holder := benchClient(b, pool, leasetable.Config{Owner: "holder", TTL: time.Minute})
	waiting := make(chan string, 1)
	waiter := benchClient(b, pool, leasetable.Config{Owner: "waiter", TTL: time.Minute, Logger: logTo(waiting)})
	lib := func() time.Duration {
		l, err := holder.TryAcquire(ctx, "handover")
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan error, 1)
		var acquired time.Time
		go func() {
			wl, err := waiter.Acquire(ctx, "handover")
			acquired = time.Now()
			if err == nil {
				err = wl.Release(ctx)
			}
			got <- err
		}()
		<-waiting
		start := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		if err := <-got; err != nil {
			b.Fatal(err)
		}
		return acquired.Sub(start)
	}

	pc, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Release()
	listen := pc.Conn()
	if _, err := listen.Exec(ctx, "LISTEN pgbaton_lease"); err != nil {
		b.Fatal(err)
	}
	defer listen.Exec(context.Background(), "UNLISTEN *")
	// waiter is the waiter id an attempt looks as, nil for none: once
	// registered, the raw waiter must look as itself, or it comes after
	// every waiter, its own registration included, and waits for ever.
	attempt := func(owner string, waiter *string) (bool, int64) {
		var ok bool
		var tok int64
		if err := pool.QueryRow(ctx, "SELECT acquired, token FROM pgbaton.lease_attempt('raw-handover', $1, 60000, p_waiter => $2)", owner, waiter).Scan(&ok, &tok); err != nil {
			b.Fatal(err)
		}
		return ok, tok
	}
	waiterID := "raw-waiter/1"
	raw := func() time.Duration {
		ok, tok := attempt("raw-holder", nil)
		if !ok {
			b.Fatal("raw holder did not get the lease")
		}
		ready := make(chan struct{})
		got := make(chan int64, 1)
		var acquired time.Time
		go func() {
			if ok, _ := attempt("raw-waiter", nil); ok {
				b.Error("raw waiter got a held lease")
			}
			if _, err := pool.Exec(ctx, "SELECT pgbaton.wait_for('raw-handover', $1)", waiterID); err != nil {
				b.Error(err)
			}
			close(ready)
			for {
				if _, err := listen.WaitForNotification(ctx); err != nil {
					b.Error(err)
					return
				}
				if ok, tok := attempt("raw-waiter", &waiterID); ok {
					acquired = time.Now()
					got <- tok
					return
				}
			}
		}()
		<-ready
		start := time.Now()
		var waiters bool
		if err := pool.QueryRow(ctx, "SELECT waiters FROM pgbaton.release('raw-handover', 'raw-holder', $1)", tok).Scan(&waiters); err != nil {
			b.Fatal(err)
		}
		if waiters {
			if _, err := pool.Exec(ctx, "SELECT pgbaton.notify_waiters('{raw-handover}')"); err != nil {
				b.Fatal(err)
			}
		}
		wtok := <-got
		took := acquired.Sub(start)
		if _, err := pool.Exec(ctx, "SELECT pgbaton.stop_waiting('raw-handover', $1), (pgbaton.release('raw-handover', 'raw-waiter', $2)).released", waiterID, wtok); err != nil {
			b.Fatal(err)
		}
		return took
	}
	var libLat, rawLat []time.Duration
	for range b.N {
		libLat = append(libLat, lib())
		rawLat = append(rawLat, raw())
	}
	b.ReportMetric(float64(percentile(libLat, 50).Microseconds())/1000, "lib_p50_ms")
	b.ReportMetric(float64(percentile(libLat, 99).Microseconds())/1000, "lib_p99_ms")
	b.ReportMetric(float64(percentile(rawLat, 50).Microseconds())/1000, "raw_p50_ms")
	b.ReportMetric(float64(percentile(rawLat, 99).Microseconds())/1000, "raw_p99_ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkClaimDecay drains a queue of 1M work items with 8 workers
// claiming and completing 100 at a time, and compares the rate over the
// first 10k items with the rate over 10k items near the 1M-th (980k to
// 990k: the very end is left out, where fewer rows than workers × batch
// remain and the rate falls for that reason alone). Finished rows must not
// slow claiming down. One op is the whole drain; run it with -benchtime 1x.
func BenchmarkClaimDecay(b *testing.B) {
	pool := durablePool(b, 10)
	ctx := context.Background()
	const rows, window, workers, batch = 1_000_000, 10_000, 8, 100
	clients := make([]*leasetable.Client, workers)
	for w := range clients {
		clients[w] = benchClient(b, pool, leasetable.Config{Owner: "w" + strconv.Itoa(w), TTL: time.Minute})
	}
	var firstRates, lastRates []float64
	for range b.N {
		b.StopTimer()
		if _, err := pool.Exec(ctx, `INSERT INTO pgbaton.lease (name, lease_group)
			SELECT 'item-' || g, 'big' FROM generate_series(1, $1::int) g`, rows); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE pgbaton.lease"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		var done atomic.Int64
		var mu sync.Mutex
		var firstEnd, lastStart, lastEnd time.Time
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					ls, err := clients[w].Claim(ctx, "big", batch)
					if err != nil {
						b.Error(err)
						return
					}
					if len(ls) == 0 {
						return
					}
					if err := clients[w].Complete(ctx, ls...); err != nil {
						b.Error(err)
						return
					}
					n := done.Add(int64(len(ls)))
					mu.Lock()
					if n >= window && firstEnd.IsZero() {
						firstEnd = time.Now()
					}
					if n >= rows-2*window && lastStart.IsZero() {
						lastStart = time.Now()
					}
					if n >= rows-window && lastEnd.IsZero() {
						lastEnd = time.Now()
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		end := time.Now()
		firstRates = append(firstRates, window/firstEnd.Sub(start).Seconds())
		lastRates = append(lastRates, window/lastEnd.Sub(lastStart).Seconds())
		b.ReportMetric(float64(rows)/end.Sub(start).Seconds(), "all_items/s")
	}
	first, last := median(firstRates), median(lastRates)
	b.ReportMetric(first, "first10k_items/s")
	b.ReportMetric(last, "at1M_items/s")
	b.ReportMetric(100*(1-last/first), "decay_%")
	b.ReportMetric(0, "ns/op")
}
