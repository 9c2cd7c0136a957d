package test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/test/check"
)

// TestChaos is the Jepsen-style run: workers contend for leases and write
// to the ledger under their tokens while the nemesis injects every kind of
// fault. Short by default (CI); `make chaos` runs many seeds for longer.
func TestChaos(t *testing.T) {
	t.Run("leases", func(t *testing.T) { runSeeds(t, false) })
	t.Run("advisory", func(t *testing.T) { runSeeds(t, true) })
}

// advisoryFaults are the faults a session lock is specified to survive
// without overlap: the holder's process dies, pauses, or its network goes
// silent or slow. Faults that end the session on the server's side first
// (pg_terminate_backend, a reset connection, a restart, an idle-session
// killer) free the lock at once, while its holder learns only at its next
// round trip (within PingInterval + PingTimeout): an advisory lock alone
// cannot exclude overlap then, which is why fenced writes exist.
// TestAdvisoryServerSideLossWindow measures that window.
var advisoryFaults = []string{faultKill, faultPause, faultStall, faultSlow}

func runSeeds(t *testing.T, advisoryLocks bool) {
	seeds := []uint64{*chaosSeed}
	if *chaosSeed == 0 {
		seeds = seeds[:0]
		for range max(*chaosSeeds, 1) {
			seeds = append(seeds, rand.Uint64()%1_000_000+1)
		}
	}
	for _, seed := range seeds {
		cfg := chaosConfig{Seed: seed, Duration: *chaosDuration, Workers: 4, Keys: 2, TTL: 2 * time.Second,
			Writes: 3, Work: 100 * time.Millisecond, Faults: allFaults, Pause: 2 * time.Second, Advisory: advisoryLocks}
		switch {
		case advisoryLocks:
			cfg.Faults = advisoryFaults
			cfg.Duration = max(cfg.Duration/2, 10*time.Second)
		case env.Cluster() == nil: // an external server cannot be restarted by the test
			cfg.Faults = []string{faultKill, faultPause, faultTerminate, faultCut, faultStall, faultSlow, faultIdleKill}
		}
		res := runChaos(t, cfg)
		line := res.line(seed)
		t.Log(line)
		println(line) // the run's one line, also without -v
		t.Logf("linearizable (porcupine, mutex model): %s; fenced lease model: %s (%d ops); ledger rows %d; worst takeover after %s; worst per fault kind: %v",
			res.Linearizable, res.Fenced.Result, res.Fenced.Ops, res.Ledger.Rows, res.WorstFault, res.WorstByKind)
		assert.Empty(t, res.Overlaps, "critical sections overlap (seed %d)", seed)
		assert.Equal(t, porcupine.Ok, res.Linearizable, "history not linearizable as a mutex (seed %d)", seed)
		assert.Equal(t, porcupine.Ok, res.Fenced.Result, "history not linearizable as a fenced lease (seed %d): %s", seed, res.Fenced.Explanation)
		assert.Empty(t, res.Ledger.StaleAccepted, "stale tokens accepted (seed %d)", seed)
		assert.Empty(t, res.Ledger.Lost, "acknowledged writes lost (seed %d)", seed)
		assert.Empty(t, res.Ledger.Doubled, "writes doubled (seed %d)", seed)
		assert.Empty(t, res.LateTakeovers, "liveness (seed %d)", seed)
		assert.Positive(t, res.Faults)
		assert.Positive(t, res.Ledger.Rows)
		if t.Failed() {
			t.Logf("replay with: go test -run 'TestChaos' ./test/ -args -chaos.seed=%d", seed)
			return
		}
	}
}

// TestCheckersBite runs the broken worker (no validity check, no fence)
// under SIGSTOP past the TTL, and requires every safety checker to catch
// it: a checker that cannot fail proves nothing.
func TestCheckersBite(t *testing.T) {
	cfg := chaosConfig{Seed: 7, Duration: 12 * time.Second, Workers: 3, Keys: 1, TTL: time.Second,
		Writes: 4, Work: 300 * time.Millisecond, Broken: true, Faults: []string{faultPause}, Pause: 2 * time.Second, HitHolders: true}
	res := runChaos(t, cfg)
	t.Log(res.line(cfg.Seed))
	require.Positive(t, res.Faults)
	assert.NotEmpty(t, res.Overlaps, "interval checker missed the overlap of a paused holder")
	assert.Equal(t, porcupine.Illegal, res.Linearizable, "porcupine missed the overlap")
	assert.Equal(t, porcupine.Illegal, res.Fenced.Result, "the fenced model missed the unfenced writes")
	t.Logf("fenced model: %s", res.Fenced.Explanation)
	assert.NotEmpty(t, res.Ledger.StaleAccepted, "fencing checker missed the stale writes")
	for _, o := range res.Overlaps[:min(3, len(res.Overlaps))] {
		t.Logf("overlap: %s", o)
	}
	for _, s := range res.Ledger.StaleAccepted[:min(3, len(res.Ledger.StaleAccepted))] {
		t.Logf("stale accepted: %s", s)
	}

	// The ledger checker also catches a lost and a doubled write: remove
	// one acknowledged row and commit another twice.
	pool := res.db.Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	tag, err := pool.Exec(ctx, "DELETE FROM chaos_ledger WHERE id = (SELECT min(id) FROM chaos_ledger)")
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	_, err = pool.Exec(ctx, `INSERT INTO chaos_ledger (key, token, op_id, seq)
		SELECT key, token, op_id, seq FROM chaos_ledger WHERE id = (SELECT max(id) FROM chaos_ledger)`)
	require.NoError(t, err)
	rep, err := check.CheckLedger(ctx, pool, pgx.Identifier{"chaos_ledger"}, res.events)
	require.NoError(t, err)
	assert.Len(t, rep.Lost, 1, "ledger checker missed a lost write")
	assert.NotEmpty(t, rep.Doubled, "ledger checker missed a doubled write")
	t.Logf("lost: %v; doubled: %v", rep.Lost, rep.Doubled)
}
