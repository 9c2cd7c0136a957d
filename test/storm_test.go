package test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/test/check"
)

// The kill storm of leasetable (TestExactlyOnceEffectsUnderKills) again,
// here because its history is checked with porcupine, which the library's
// module must not depend on: workers claim work items, do each item's
// effect and CompleteTx in one transaction, and are SIGKILLed at random.
var (
	stormItems = flag.Int("storm.items", 100, "TestKillStormHistory: items in the queue")
	stormKills = flag.Int("storm.kills", 12, "TestKillStormHistory: kills at least (the queue is filled again until then)")
)

func init() { children["storm"] = childStorm }

const stormGroup = "storm"

// TestKillStormHistory: under SIGKILLs every item has exactly one effect
// and the history is a fenced lease per item (and a mutex): no effect
// committed under a token that was not its item's current one.
func TestKillStormHistory(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ctx := pgtest.Context(t, 4*time.Minute)
	_, err := pool.Exec(ctx, `CREATE TABLE storm_head (key text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
		CREATE TABLE storm_ledger (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL, op_id text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)
	reg, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "storm-parent"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	registered := 0
	register := func() {
		names := make([]string, *stormItems)
		for i := range names {
			names[i] = fmt.Sprintf("item-%06d", registered+i)
		}
		_, err := pool.Exec(ctx, "INSERT INTO storm_head (key) SELECT unnest($1::text[])", names)
		require.NoError(t, err)
		_, err = reg.Register(ctx, stormGroup, names...)
		require.NoError(t, err)
		registered += len(names)
	}
	register()
	remaining := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease WHERE lease_group = $1", stormGroup).Scan(&n))
		return n
	}

	hist := check.NewHistory()
	stopFile := filepath.Join(t.TempDir(), "stop")
	type worker struct {
		child *pgtest.Child
		read  chan struct{} // closed when its stdout is read to the end
	}
	nextID := 0
	start := func() worker {
		nextID++
		w := worker{child: env.StartChild(t, "storm", d.URL, strconv.Itoa(nextID), stopFile), read: make(chan struct{})}
		ready := make(chan struct{})
		go func() {
			defer close(w.read)
			for line := range w.child.Lines() {
				var ev check.Event
				switch {
				case line == "ready":
					close(ready)
				case json.Unmarshal([]byte(line), &ev) == nil && ev.Op != "":
					hist.Add(ev)
				}
			}
		}()
		// Kills are meant for workers at work, not starting up.
		select {
		case <-ready:
		case <-w.read:
			<-w.child.Done()
			t.Fatalf("storm worker exited before it was ready: %v\n%s", w.child.Cmd.ProcessState, w.child.Stderr())
		case <-time.After(time.Minute):
			t.Fatalf("storm worker not ready within a minute:\n%s", w.child.Stderr())
		}
		return w
	}
	ws := make([]worker, 3)
	for i := range ws {
		ws[i] = start()
	}
	kills := 0
	for kills < *stormKills || remaining() > 0 {
		require.NoError(t, ctx.Err())
		time.Sleep(50*time.Millisecond + rand.N(200*time.Millisecond)) // the nemesis's pace
		if kills < *stormKills && remaining() < *stormItems/10 {
			register() // keep the storm going on a full queue
		}
		i := rand.N(len(ws))
		ws[i].child.Signal(t, syscall.SIGKILL)
		<-ws[i].read
		<-ws[i].child.Done()
		kills++
		ws[i] = start()
	}
	// The storm is over: the workers finish the queue, then stop.
	pgtest.Eventually(t, 2*time.Minute, func() (bool, error) { return remaining() == 0, nil }, "items left after the storm")
	require.NoError(t, os.WriteFile(stopFile, nil, 0o600))
	for _, w := range ws {
		select {
		case <-w.read:
		case <-time.After(time.Minute):
			t.Fatalf("storm worker did not stop:\n%s", w.child.Stderr())
		}
		<-w.child.Done()
		assert.True(t, w.child.Cmd.ProcessState.Success(), "storm worker failed: %v\n%s", w.child.Cmd.ProcessState, w.child.Stderr())
	}

	events := hist.Snapshot()
	var doubled, missing int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n > 1), $1 - count(*)
		FROM (SELECT key, count(*) AS n FROM storm_ledger GROUP BY key) e`, registered).Scan(&doubled, &missing))
	ledger, err := check.CheckLedger(ctx, pool, pgx.Identifier{"storm_ledger"}, events)
	require.NoError(t, err)
	ordered, err := check.LedgerOrder(ctx, pool, pgx.Identifier{"storm_ledger"}, events)
	require.NoError(t, err)
	gs, unknown := check.Grants(events)
	overlaps := check.Overlaps(gs)
	lin := check.Linearizable(gs, unknown, time.Minute)
	fenced := check.FencedLinearizable(ordered, time.Minute)
	t.Logf("kill storm: %d items, 3 workers, %d kills, %d events, %d grants; doubled %d missing %d lost %d; overlaps %d; mutex model %s; fenced lease model %s (%d ops)",
		registered, kills, len(events), len(gs), doubled, missing, len(ledger.Lost), len(overlaps), lin, fenced.Result, fenced.Ops)
	assert.Zero(t, doubled, "items with more than one effect")
	assert.Zero(t, missing, "items without an effect")
	assert.Empty(t, ledger.Lost, "acknowledged effects lost")
	assert.Empty(t, ledger.Doubled, "effects doubled")
	assert.Empty(t, overlaps, "critical sections overlap")
	assert.Equal(t, porcupine.Ok, lin, "history not linearizable as a mutex per item")
	assert.Equal(t, porcupine.Ok, fenced.Result, "history not linearizable as a fenced lease per item: %s", fenced.Explanation)
	assert.Positive(t, fenced.Ops)
}

// childStorm is a kill storm worker: args are the database URL, its proc
// id and the stop file. It claims one item at a time, so that a proc
// holds at most one lease, as check.Grants expects.
func childStorm(ctx context.Context, args []string) error {
	proc, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: fmt.Sprintf("storm-p%d", proc), TTL: time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	em := check.NewEmitter(proc, os.Stdout)
	fmt.Println("ready")
	for n := 0; ; n++ {
		if _, err := os.Stat(args[2]); err == nil {
			return nil
		}
		invoked := check.MonoNow()
		ls, err := c.Claim(ctx, stormGroup, 1)
		if err != nil {
			return err
		}
		if len(ls) == 0 {
			time.Sleep(20 * time.Millisecond) // an idle worker looks again later; not synchronisation
			continue
		}
		// A claim names its item only once it returns: its invoke is
		// written then, with the time it was sent.
		l := ls[0]
		em.Emit(check.Event{Key: l.Name(), Op: check.OpAcquire, Type: check.EvInvoke, Mono: invoked})
		em.Emit(check.Event{Key: l.Name(), Op: check.OpAcquire, Type: check.EvOK, Token: l.Token()})
		stormItem(ctx, em, pool, c, l, fmt.Sprintf("p%d-%d", proc, n))
	}
}

// stormItem does an item's effect and completes it, and if that failed
// releases it.
func stormItem(ctx context.Context, em *check.Emitter, pool *pgxpool.Pool, c *leasetable.Client, l *leasetable.Lease, id string) {
	key, tok := l.Name(), l.Token()
	valid := func() (int64, bool) {
		t := check.MonoNow()
		return t, l.Err() == nil && time.Now().Before(l.Deadline())
	}
	lastValid, ok := valid()
	if ok {
		em.Emit(check.Event{Key: key, Op: check.OpWrite, Type: check.EvInvoke, Mono: lastValid, Token: tok, OpID: id})
		typ, err := stormEffect(l.Context(), pool, c, l, id)
		ev := check.Event{Key: key, Op: check.OpWrite, Type: typ, Token: tok, OpID: id}
		if err != nil {
			ev.Err = err.Error()
		}
		em.Emit(ev)
		if typ == check.EvOK {
			// Completed: the lease ended with the commit.
			em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: tok})
			em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvOK, Token: tok})
			return
		}
		if t, ok := valid(); ok {
			lastValid = t
		}
	}
	em.Emit(check.Event{Key: key, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: tok})
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	err := l.Release(rctx)
	cancel()
	ev := check.Event{Key: key, Op: check.OpRelease, Type: check.EvOK, Token: tok}
	switch {
	case err == nil:
	case errors.Is(err, leasetable.ErrNotHeld) || errors.Is(err, leasetable.ErrLeaseLost):
		ev.Type, ev.Err = check.EvFail, err.Error()
	default:
		ev.Type, ev.Err = check.EvUnknown, err.Error()
	}
	em.Emit(ev)
}

// stormEffect writes the item's effect to the ledger and completes the
// item in the same transaction.
func stormEffect(ctx context.Context, pool *pgxpool.Pool, c *leasetable.Client, l *leasetable.Lease, id string) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return check.EvFail, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var seq int64
	if err := tx.QueryRow(ctx, "UPDATE storm_head SET seq = seq + 1 WHERE key = $1 RETURNING seq", l.Name()).Scan(&seq); err != nil {
		return check.EvFail, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO storm_ledger (key, token, op_id, seq) VALUES ($1, $2, $3, $4)", l.Name(), l.Token(), id, seq); err != nil {
		return check.EvFail, err
	}
	time.Sleep(time.Duration(5+rand.N(20)) * time.Millisecond) // the work takes a while: a kill can land mid-item
	if err := c.CompleteTx(ctx, tx, l); err != nil {
		return check.EvFail, err
	}
	if err := tx.Commit(ctx); err != nil {
		return check.EvUnknown, err
	}
	return check.EvOK, nil
}
