//go:build unix

package leasetable_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/leasetable"
)

// BenchmarkCompleteAndClaimClientPath measures where pgbaton's client
// time goes on the work-queue loop: one worker, batch 1 and batch 100,
// CompleteAndClaim against raw pgx sending the same two statements with
// the same arguments (complete_many, and claim bound to a lease session
// and a request id) on a connection of its own. It reports, per call, the
// process's CPU time and the wall time, medians of interleaved rounds:
//
//	lib:  a context that can end (the usual case): the statement is sent
//	      from a goroutine of the client's, so the caller can return when
//	      the context ends (see the package doc, Goroutines)
//	libbg: context.Background, which cannot end: the statement runs on
//	      the caller's goroutine; lib - libbg is the cost of that hand-off
//	raw:  the same SQL through pgx
func BenchmarkCompleteAndClaimClientPath(b *testing.B) {
	pool := durablePool(b, 4)
	c := benchClient(b, pool, leasetable.Config{Owner: "lib", TTL: time.Minute})
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprint("batch=", n), func(b *testing.B) { completeAndClaimClientPath(b, pool, c, n) })
	}
}

func completeAndClaimClientPath(b *testing.B, pool *pgxpool.Pool, c *leasetable.Client, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 2000 / n
	register := func(group string) {
		names := make([]string, (calls+1)*n)
		for i := range names {
			names[i] = fmt.Sprint(group, "/", i)
		}
		if _, err := c.Register(ctx, group, names...); err != nil {
			b.Fatal(err)
		}
	}
	lib := func(group string, cctx context.Context) {
		ls, err := c.Claim(ctx, group, n)
		for i := 0; i < calls && err == nil; i++ {
			ls, err = c.CompleteAndClaim(cctx, group, n, ls...)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	raw := func(group string) {
		err := pool.AcquireFunc(ctx, func(pc *pgxpool.Conn) error {
			var session int64
			if err := pc.QueryRow(ctx, "SELECT id FROM pgbaton.session_open($1, $2)", "raw", 600000).Scan(&session); err != nil {
				return err
			}
			const claimSQL = "SELECT name, token FROM pgbaton.claim($1, $2, $3, $4, $5, $6, false)"
			var names []string
			var tokens []int64
			scan := func(rows pgx.Rows) error {
				names, tokens = names[:0], tokens[:0]
				var name string
				var token int64
				_, err := pgx.ForEachRow(rows, []any{&name, &token}, func() error {
					names, tokens = append(names, name), append(tokens, token)
					return nil
				})
				return err
			}
			rows, _ := pc.Query(ctx, claimSQL, group, "raw", n, 60000, session, requestID())
			if err := scan(rows); err != nil {
				return err
			}
			for range calls {
				batch := &pgx.Batch{}
				batch.Queue("SELECT name FROM pgbaton.complete_many($1, $2, $3) AS name", names, tokens, "raw")
				batch.Queue(claimSQL, group, "raw", n, 60000, session, requestID()).Query(scan)
				if err := pc.SendBatch(ctx, batch).Close(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	variants := []struct {
		name string
		run  func(group string)
	}{
		{"lib", func(g string) { lib(g, ctx) }},
		{"libbg", func(g string) { lib(g, context.Background()) }},
		{"raw", raw},
	}
	const rounds = 5
	cpu := make([][]float64, len(variants))
	wall := make([][]float64, len(variants))
	for r := range rounds {
		for k := range variants {
			i := (k + r) % len(variants)
			group := fmt.Sprint(variants[i].name, "-", n, "-", r)
			register(group)
			c0, w0 := processCPU(b), time.Now()
			variants[i].run(group)
			cpu[i] = append(cpu[i], float64((processCPU(b)-c0).Microseconds())/float64(calls))
			wall[i] = append(wall[i], float64(time.Since(w0).Microseconds())/float64(calls))
		}
	}
	for i, v := range variants {
		b.ReportMetric(median(cpu[i]), v.name+"_cpu_µs/call")
		b.ReportMetric(median(wall[i]), v.name+"_wall_µs/call")
	}
	b.ReportMetric(0, "ns/op")
}

// processCPU is the CPU time the process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// requestID is a claim's request id: random bytes, sent as a uuid.
func requestID() (id [16]byte) {
	_, _ = rand.Read(id[:])
	return id
}
