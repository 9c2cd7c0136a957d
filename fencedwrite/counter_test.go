package fencedwrite_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

// The Jepsen "lock-protected counter" (etcd's lock-set workloads): worker
// processes increment one counter under a lease with read, sleep, write,
// while a nemesis pauses lease holders past their TTL (SIGSTOP) between the
// read and the write, and then resumes or kills them. Without the guard a
// resumed holder writes its stale read back and increments are lost; with
// the guard every acknowledged increment is in the counter.

const (
	counterWorkers = 4
	counterTTL     = 300 * time.Millisecond
	counterSleep   = 250 * time.Millisecond // read-to-write gap; long enough that the nemesis stops the victim inside it
	counterRounds  = 6                      // nemesis rounds; even ones resume the victim, odd ones kill it
	counterMinAcks = 15                     // acknowledged increments before the workers stop
	counterLease   = "counter"
)

// counterChild is one worker process. args: url, mode ("guard" or
// "none"), owner. It takes the lease with leasetable (which renews it in
// the background, and cannot while the process is stopped), and prints
// READ token value, then ACK token value or REJ token for every increment
// it attempts, until ctl.stop is set.
func counterChild(ctx context.Context, args []string) error {
	url, mode, owner := args[0], args[1], args[2]
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: owner, TTL: counterTTL})
	if err != nil {
		return err
	}
	defer client.Close(ctx)
	stopped := func() (bool, error) {
		var stop bool
		err := pool.QueryRow(ctx, "SELECT stop FROM ctl").Scan(&stop)
		return stop, err
	}
	for {
		if stop, err := stopped(); err != nil || stop {
			return err
		}
		lease, err := client.Acquire(ctx, counterLease) // waits for the holder's release or expiry
		if err != nil {
			return err
		}
		if stop, err := stopped(); err != nil || stop {
			_ = lease.Release(ctx)
			return err
		}
		token := lease.Token()
		var v int64
		if err := pool.QueryRow(ctx, "SELECT value FROM counter").Scan(&v); err != nil {
			return err
		}
		pgtest.Printf("READ %d %d", token, v)
		// The nemesis pauses us here. Like a real process paused by GC, we
		// do not look at lease.Done() again before writing.
		time.Sleep(counterSleep)
		write := func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE counter SET value = $1", v+1); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO history (value, token, owner) VALUES ($1, $2, $3)", v+1, token, owner)
			return err
		}
		if mode == "guard" {
			err = fencedwrite.InTx(ctx, pool, lease, write)
		} else {
			err = pgx.BeginFunc(ctx, pool, write)
		}
		switch {
		case errors.Is(err, fencedwrite.ErrStaleToken):
			pgtest.Printf("REJ %d 0", token)
		case err != nil:
			return err
		default:
			pgtest.Printf("ACK %d %d", token, v+1)
		}
		_ = lease.Release(ctx) // fails with ErrNotHeld after a takeover: nothing to give back
	}
}

type counterEvent struct {
	worker int
	kind   string // READ, ACK, REJ
	token  int64
	value  int64
}

type counterRun struct {
	acks, rejs []counterEvent
	final      int64
	resumed    int // victims resumed after their lease moved on
	killed     int
	history    []counterEvent // accepted writes in commit order (by value)
}

func runCounter(t *testing.T, mode string) counterRun {
	ctx := testContext(t)
	db := env.DB(t)
	pool := db.Pool(t)
	_, err := pool.Exec(ctx, `
		CREATE TABLE counter (value bigint NOT NULL);
		INSERT INTO counter VALUES (0);
		CREATE TABLE history (seq bigserial PRIMARY KEY, value bigint NOT NULL, token bigint NOT NULL, owner text NOT NULL);
		CREATE TABLE ctl (stop bool NOT NULL);
		INSERT INTO ctl VALUES (false);`)
	require.NoError(t, err)

	events := make(chan counterEvent, 1024)
	var readers sync.WaitGroup
	workers := map[int]*pgtest.Child{}
	start := func(i int) {
		c := env.StartChild(t, "counter", db.URL, mode, fmt.Sprintf("worker-%d", i))
		workers[i] = c
		readers.Add(1)
		go func() {
			defer readers.Done()
			for line := range c.Lines() {
				var ev counterEvent
				if _, err := fmt.Sscanf(line, "%s %d %d", &ev.kind, &ev.token, &ev.value); err == nil {
					ev.worker = i
					events <- ev
				}
			}
		}()
	}
	for i := range counterWorkers {
		start(i)
	}

	var run counterRun
	record := func(ev counterEvent) {
		switch ev.kind {
		case "ACK":
			run.acks = append(run.acks, ev)
		case "REJ":
			run.rejs = append(run.rejs, ev)
		}
	}
	next := func() counterEvent {
		t.Helper()
		select {
		case ev := <-events:
			record(ev)
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no worker made progress for 30s")
			panic("unreachable")
		}
	}

	nextWorker := counterWorkers
	for round := range counterRounds {
		victim := next()
		for victim.kind != "READ" {
			victim = next()
		}
		// The victim read the counter and sleeps before writing: pause it
		// there, past its lease.
		workers[victim.worker].Signal(t, syscall.SIGSTOP)
		for ev := next(); ev.kind != "ACK" || ev.token <= victim.token; ev = next() {
		}
		// Its lease was taken over and a newer holder has written.
		if round%2 == 0 {
			workers[victim.worker].Signal(t, syscall.SIGCONT)
			run.resumed++
		} else {
			workers[victim.worker].Signal(t, syscall.SIGKILL)
			<-workers[victim.worker].Done()
			delete(workers, victim.worker)
			run.killed++
			start(nextWorker)
			nextWorker++
		}
	}

	// Some undisturbed increments too, for a longer history.
	for len(run.acks) < counterMinAcks {
		next()
	}
	_, err = pool.Exec(ctx, "UPDATE ctl SET stop = true")
	require.NoError(t, err)
	go func() {
		readers.Wait()
		close(events)
	}()
	for ev := range events {
		record(ev)
	}
	for _, c := range workers {
		require.NoError(t, c.Wait(t, 30*time.Second), c.Stderr())
	}

	require.NoError(t, pool.QueryRow(ctx, "SELECT value FROM counter").Scan(&run.final))
	rows, err := pool.Query(ctx, "SELECT value, token FROM history ORDER BY value, seq")
	require.NoError(t, err)
	for rows.Next() {
		var ev counterEvent
		require.NoError(t, rows.Scan(&ev.value, &ev.token))
		run.history = append(run.history, ev)
	}
	require.NoError(t, rows.Err())
	t.Logf("%s: %d acknowledged increments, counter %d, %d rejected writes, %d victims resumed, %d killed",
		mode, len(run.acks), run.final, len(run.rejs), run.resumed, run.killed)
	return run
}

func TestLockProtectedCounter(t *testing.T) {
	t.Run("unguarded loses updates", func(t *testing.T) {
		run := runCounter(t, "none")
		// The test can fail: without the fence, resumed holders write
		// their stale reads back.
		require.Less(t, run.final, int64(len(run.acks)), "lost updates")
		require.Empty(t, run.rejs)
	})

	t.Run("guarded loses none", func(t *testing.T) {
		run := runCounter(t, "guard")
		require.Equal(t, int64(len(run.acks)), run.final, "every acknowledged increment is in the counter")
		require.NotEmpty(t, run.rejs, "resumed stale holders were rejected")

		var highest int64
		for _, a := range run.acks {
			highest = max(highest, a.token)
		}
		for _, r := range run.rejs {
			require.Less(t, r.token, highest, "a rejected write carried a token below the highest accepted one")
		}
		// In commit order (each write stored read+1), accepted tokens
		// strictly increase, and no value was written twice.
		require.Len(t, run.history, int(run.final))
		for i, h := range run.history {
			require.Equal(t, int64(i+1), h.value)
			if i > 0 {
				require.Greater(t, h.token, run.history[i-1].token, "tokens in commit order")
			}
		}
	})
}
