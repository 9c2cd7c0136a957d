package advisory_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// Benchmarks run against the test binary's throwaway cluster on loopback
// and measure raw pgx doing the same SQL in the same run: the reported
// ratios are what matters, absolute rates vary with the machine.

// rawPair is what TryLock+Unlock cost with bare pgx: two round trips.
func rawPair(ctx context.Context, conn *pgx.Conn, key int64) error {
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		return err
	}
	return conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok)
}

func rawConn(b *testing.B, d *pgtest.DB) *pgx.Conn {
	conn, err := pgx.Connect(context.Background(), d.URL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// BenchmarkTryLockUnlock: one goroutine, uncontended TryLock+Unlock on a
// Locker versus two round trips of raw pgx on one connection.
func BenchmarkTryLockUnlock(b *testing.B) { benchTryLockUnlock(b, advisory.Config{}) }

// BenchmarkTryLockUnlockMetrics is BenchmarkTryLockUnlock with metrics
// recorded into the OpenTelemetry SDK (names off): what they cost when on.
func BenchmarkTryLockUnlockMetrics(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	benchTryLockUnlock(b, advisory.Config{MeterProvider: mp})
}

func benchTryLockUnlock(b *testing.B, cfg advisory.Config) {
	d := env.DB(b)
	ctx := context.Background()
	l := newLocker(b, d.Pool(b), cfg)
	conn := rawConn(b, d)
	key := advisory.Int64(1)
	warm, err := l.TryLock(ctx, key) // opens the session outside the timing
	if err != nil {
		b.Fatal(err)
	}
	_ = warm.Unlock(ctx)
	_ = rawPair(ctx, conn, 2)

	// Interleaved in chunks, alternating which side goes first, so that
	// load from elsewhere on the machine hits both sides alike.
	var ours, raw time.Duration
	runOurs := func(n int) {
		start := time.Now()
		for range n {
			lk, err := l.TryLock(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		ours += time.Since(start)
	}
	runRaw := func(n int) {
		b.StopTimer()
		start := time.Now()
		for range n {
			if err := rawPair(ctx, conn, 2); err != nil {
				b.Fatal(err)
			}
		}
		raw += time.Since(start)
		b.StartTimer()
	}
	b.ResetTimer()
	for done, i := 0, 0; done < b.N; i++ {
		chunk := min(10, b.N-done)
		if i%2 == 0 {
			runOurs(chunk)
			runRaw(chunk)
		} else {
			runRaw(chunk)
			runOurs(chunk)
		}
		done += chunk
	}
	b.StopTimer()
	b.ReportMetric(perSecond(b.N, ours), "pairs/s")
	b.ReportMetric(perSecond(b.N, raw), "raw-pairs/s")
	b.ReportMetric(raw.Seconds()/ours.Seconds(), "x-raw")
}

// BenchmarkParallel8: 8 goroutines on one Locker (one session, requests
// pipelined) versus 8 goroutines with a raw connection each, and versus
// the one-goroutine rate of the same Locker.
func BenchmarkParallel8(b *testing.B) {
	const workers = 8
	d := env.DB(b)
	ctx := context.Background()
	l := newLocker(b, d.Pool(b), advisory.Config{})
	conns := make([]*pgx.Conn, workers)
	for i := range conns {
		conns[i] = rawConn(b, d)
	}
	warm, err := l.TryLock(ctx, advisory.Int64(-1))
	if err != nil {
		b.Fatal(err)
	}
	_ = warm.Unlock(ctx)

	run := func(n int, fn func(w, i int) error) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					if err := fn(w, i); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	lockUnlock := func(w, _ int) error {
		lk, err := l.TryLock(ctx, advisory.Int64(int64(w)))
		if err != nil {
			return err
		}
		return lk.Unlock(ctx)
	}
	// Four alternating rounds of each, so that load from elsewhere on the
	// machine hits all sides alike.
	const rounds = 4
	n := max(1, b.N/workers/rounds)
	var ours, raw, single time.Duration
	b.ResetTimer()
	for range rounds {
		b.StartTimer()
		ours += run(n, lockUnlock)
		b.StopTimer()
		raw += run(n, func(w, _ int) error { return rawPair(ctx, conns[w], int64(w)) })
		start := time.Now()
		for i := range n * workers / 2 {
			if err := lockUnlock(0, i); err != nil {
				b.Fatal(err)
			}
		}
		single += time.Since(start)
	}
	n *= rounds
	b.ReportMetric(perSecond(n*workers, ours), "pairs/s")
	b.ReportMetric(perSecond(n*workers, raw), "raw8-pairs/s")
	b.ReportMetric(raw.Seconds()/ours.Seconds(), "x-raw8")
	b.ReportMetric(perSecond(n*workers, ours)/perSecond(n*workers/2, single), "x-1goroutine")
}

// BenchmarkHandover: latency from the holder's Unlock to the waiter's
// Lock returning, p50 and p99, versus raw pgx (unlock on one connection,
// pg_advisory_lock blocked on another).
func BenchmarkHandover(b *testing.B) {
	d := env.DB(b)
	ctx := context.Background()
	admin := adminPool(b)
	holderL := newLocker(b, d.Pool(b), advisory.Config{})
	waiterL := newLocker(b, d.Pool(b), advisory.Config{})
	key := advisory.Int64(77)
	waitForWaiter := func() {
		for {
			_, w := advisoryLocks(b, admin, d)
			if w > 0 {
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}

	holder, waiter := rawConn(b, d), rawConn(b, d)
	rawHandover := func() time.Duration {
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(78)"); err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			if _, err := waiter.Exec(ctx, "SELECT pg_advisory_lock(78)"); err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		waitForWaiter()
		start := time.Now()
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(78)"); err != nil {
			b.Fatal(err)
		}
		d := (<-got).Sub(start)
		if _, err := waiter.Exec(ctx, "SELECT pg_advisory_unlock(78)"); err != nil {
			b.Fatal(err)
		}
		return d
	}

	// The whole cycle is timed (so that -benchtime bounds the run); the
	// latencies are the reported metrics.
	var ours, raw []time.Duration
	b.ResetTimer()
	for range b.N {
		raw = append(raw, rawHandover())
		held, err := holderL.TryLock(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		var lk *advisory.Lock
		go func() {
			var err error
			lk, err = waiterL.Lock(ctx, key)
			if err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		waitForWaiter()
		start := time.Now()
		if err := held.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, (<-got).Sub(start))
		if lk != nil {
			_ = lk.Unlock(ctx)
		}
	}
	p := func(ds []time.Duration, q float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds())
	}
	b.ReportMetric(p(ours, 0.5), "p50-µs")
	b.ReportMetric(p(ours, 0.99), "p99-µs")
	b.ReportMetric(p(raw, 0.5), "raw-p50-µs")
	b.ReportMetric(p(raw, 0.99), "raw-p99-µs")
}

// BenchmarkContended8: 8 Lockers (each standing for a process of its own)
// loop blocking Lock+Unlock on one key, versus 8 raw pgx connections
// looping pg_advisory_lock+pg_advisory_unlock on another key, in
// alternating rounds.
func BenchmarkContended8(b *testing.B) {
	const clients = 8
	d := env.DB(b)
	ctx := context.Background()
	lockers := make([]*advisory.Locker, clients)
	conns := make([]*pgx.Conn, clients)
	for i := range clients {
		lockers[i] = newLocker(b, d.Pool(b), advisory.Config{})
		conns[i] = rawConn(b, d)
	}
	key := advisory.Int64(91)
	run := func(n int, fn func(i int) error) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for i := range clients {
			wg.Go(func() {
				for range n {
					if err := fn(i); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	ours := func(i int) error {
		lk, err := lockers[i].Lock(ctx, key)
		if err != nil {
			return err
		}
		return lk.Unlock(ctx)
	}
	raw := func(i int) error {
		if _, err := conns[i].Exec(ctx, "SELECT pg_advisory_lock(92)"); err != nil {
			return err
		}
		_, err := conns[i].Exec(ctx, "SELECT pg_advisory_unlock(92)")
		return err
	}
	run(10, ours) // open the sessions and spares outside the timing
	run(10, raw)
	const rounds = 4
	n := max(1, b.N/clients/rounds)
	var tOurs, tRaw time.Duration
	b.ResetTimer()
	for r := range rounds {
		if r%2 == 0 {
			tOurs += run(n, ours)
			b.StopTimer()
			tRaw += run(n, raw)
			b.StartTimer()
		} else {
			b.StopTimer()
			tRaw += run(n, raw)
			b.StartTimer()
			tOurs += run(n, ours)
		}
	}
	b.StopTimer()
	total := n * rounds * clients
	b.ReportMetric(perSecond(total, tOurs), "acq/s")
	b.ReportMetric(perSecond(total, tRaw), "raw-acq/s")
	b.ReportMetric(tRaw.Seconds()/tOurs.Seconds(), "x-raw")
}

// BenchmarkKillHandover: a child process holds the lock (through a Locker,
// or on a raw pgx connection) and is SIGKILLed while this process waits
// for it (a Locker, or a raw connection); latency from the kill to the
// waiter holding the lock, p50, for both.
func BenchmarkKillHandover(b *testing.B) {
	d := env.DB(b)
	ctx := context.Background()
	admin := adminPool(b)
	waiter := newLocker(b, d.Pool(b), advisory.Config{})
	conn := rawConn(b, d)
	sample := func(child string, lock func(name string) (func(), error)) time.Duration {
		name := fmt.Sprintf("kill:%s", child)
		holder := env.StartChild(b, child, d.URL, name)
		holder.Expect(b, "locked", time.Minute)
		got := make(chan time.Time, 1)
		var unlock func()
		go func() {
			u, err := lock(name)
			if err != nil {
				b.Error(err)
			}
			unlock = u
			got <- time.Now()
		}()
		eventuallyWaiting(b, admin, d, 1)
		start := time.Now()
		holder.Signal(b, syscall.SIGKILL)
		at := <-got
		if unlock != nil {
			unlock()
		}
		_ = holder.Wait(b, time.Minute)
		return at.Sub(start)
	}
	ours := func(name string) (func(), error) {
		lk, err := waiter.Lock(ctx, advisory.Name(name))
		if err != nil {
			return nil, err
		}
		return func() { _ = lk.Unlock(ctx) }, nil
	}
	raw := func(name string) (func(), error) {
		key, _ := advisory.NameKey("", name)
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
			return nil, err
		}
		return func() { _, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key) }, nil
	}
	var lo, lr []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			lo = append(lo, sample("hold", ours))
			lr = append(lr, sample("rawhold", raw))
		} else {
			lr = append(lr, sample("rawhold", raw))
			lo = append(lo, sample("hold", ours))
		}
	}
	b.StopTimer()
	p50 := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds())
	}
	b.ReportMetric(p50(lo), "p50-µs")
	b.ReportMetric(p50(lr), "raw-p50-µs")
	b.ReportMetric(p50(lo)/p50(lr), "x-raw")
}
