package test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/test/check"
)

// The lock-set storm: processes each take random subsets of a few names
// as all-or-nothing sets (leasetable.AcquireAll, advisory.LockAll), in
// random order, for a while. `make test` runs it briefly; `make locksets`
// runs it for a minute and prints the figures.
var (
	locksetDuration = flag.Duration("locksets.duration", 5*time.Second, "TestLockSetStorm: how long each process takes sets")
	locksetProcs    = flag.Int("locksets.procs", 16, "TestLockSetStorm: processes")
	locksetNames    = flag.Int("locksets.names", 10, "TestLockSetStorm: names to choose from")
	locksetSize     = flag.Int("locksets.size", 3, "TestLockSetStorm: names per set")
)

func init() { children["lockset"] = childLockSet }

// locksetStall is how long one set may take before a process counts
// itself stuck: far beyond any fair wait behind 15 others holding sets
// for a few milliseconds, however loaded the machine.
const locksetStall = 30 * time.Second

// locksetGate is the advisory key of the storm's start line.
const locksetGate = 0x6c6f636b73657473 // "locksets"

// TestLockSetStorm: 16 processes, each with its own pool and client, take
// random 3-name sets of 10 names: no set waits forever (a deadlock would
// stall a process past locksetStall and fail it), no name has two holders
// at once (check.Overlaps over every lease of every set), and every
// process gets sets. It logs the throughput (sets/s, all processes) and
// the fairness (most sets of a process divided by fewest).
func TestLockSetStorm(t *testing.T) {
	for _, mode := range []string{"lease", "advisory"} {
		t.Run(mode, func(t *testing.T) { locksetStorm(t, mode) })
	}
}

func locksetStorm(t *testing.T, mode string) {
	d := env.DB(t)
	hist := check.NewHistory()
	sets := make([]int, *locksetProcs)
	slowest := make([]time.Duration, *locksetProcs) // the longest each process waited for a set
	children := make([]*pgtest.Child, *locksetProcs)
	read := make([]chan struct{}, *locksetProcs)
	seed := rand.Uint64()
	// The start line: every process takes its first set when the parent
	// lets go of this lock, so that none runs alone while the others start.
	ctx := pgtest.Context(t, *locksetDuration+locksetStall+2*time.Minute)
	gate, err := d.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer gate.Release()
	_, err = gate.Exec(ctx, "SELECT pg_advisory_lock($1)", locksetGate)
	require.NoError(t, err)
	ready := make(chan int, *locksetProcs)
	for p := range children {
		children[p] = env.StartChild(t, "lockset", d.URL, mode, strconv.Itoa(p), locksetDuration.String(),
			strconv.Itoa(*locksetNames), strconv.Itoa(*locksetSize), strconv.FormatUint(seed, 10))
		read[p] = make(chan struct{})
		go func() {
			defer close(read[p])
			for line := range children[p].Lines() {
				var ev check.Event
				if line == "ready" {
					ready <- p
				} else if f := strings.Fields(line); len(f) == 3 && f[0] == "sets" {
					// Read by the test once read[p] is closed.
					sets[p], _ = strconv.Atoi(f[1])
					d, _ := strconv.ParseInt(f[2], 10, 64)
					slowest[p] = time.Duration(d)
				} else if json.Unmarshal([]byte(line), &ev) == nil && ev.Op != "" {
					hist.Add(ev)
				}
			}
		}()
	}
	for range children {
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatal("lock-set processes not ready in time")
		}
	}
	_, err = gate.Exec(ctx, "SELECT pg_advisory_unlock($1)", locksetGate)
	require.NoError(t, err)
	timeout := time.After(*locksetDuration + locksetStall + time.Minute)
	for p, c := range children {
		select {
		case <-read[p]:
		case <-timeout:
			t.Fatalf("lock-set process %d did not finish: stuck?\n%s", p, c.Stderr())
		}
		<-c.Done()
		require.True(t, c.Cmd.ProcessState.Success(), "lock-set process %d failed: %v\n%s", p, c.Cmd.ProcessState, c.Stderr())
	}
	gs, unknown := check.Grants(hist.Snapshot())
	overlaps := check.Overlaps(gs)
	total, most, fewest := 0, slices.Max(sets), slices.Min(sets)
	for _, n := range sets {
		total += n
	}
	fairness := float64(most) / float64(max(fewest, 1))
	t.Logf("lock-set storm (%s): %d processes, %d-name sets of %d names, %s: %d sets, %.0f sets/s, per process %d..%d (fairness %.2f), slowest set %s, %d grants checked, %d overlaps, seed %d",
		mode, *locksetProcs, *locksetSize, *locksetNames, *locksetDuration, total, float64(total)/locksetDuration.Seconds(),
		fewest, most, fairness, slices.Max(slowest).Round(time.Millisecond), len(gs), len(overlaps), seed)
	assert.Empty(t, unknown, "acquires whose outcome is unknown")
	assert.Empty(t, overlaps, "two holders of a name at once")
	assert.Positive(t, fewest, "a process got no set: %v", sets)
	assert.Equal(t, total**locksetSize, len(gs), "a grant per name of every set")
}

// childLockSet takes random sets until its duration has passed, printing
// every lease of every set as a history (one proc per place in the set, so
// that each holds one name at a time, as check.Grants expects), then
// "sets N D": how many sets it took, and the longest it waited for one
// (nanoseconds). args: URL, mode (lease or advisory), process, duration,
// names, names per set, seed.
func childLockSet(ctx context.Context, args []string) error {
	mode, p := args[1], args[2]
	proc, err1 := strconv.Atoi(p)
	dur, err2 := time.ParseDuration(args[3])
	names, err3 := strconv.Atoi(args[4])
	size, err4 := strconv.Atoi(args[5])
	seed, err5 := strconv.ParseUint(args[6], 10, 64)
	for _, err := range []error{err1, err2, err3, err4, err5} {
		if err != nil {
			return err
		}
	}
	pool, err := pgxpool.New(ctx, args[0])
	if err != nil {
		return err
	}
	defer pool.Close()
	var take func(ctx context.Context, names []string) (*heldSet, error)
	switch mode {
	case "lease":
		c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "lockset-p" + p, TTL: 5 * time.Second})
		if err != nil {
			return err
		}
		defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
		take = func(ctx context.Context, names []string) (*heldSet, error) {
			s, err := c.AcquireAll(ctx, names...)
			if err != nil {
				return nil, err
			}
			h := &heldSet{names: names, valid: func() bool { return s.Err() == nil }, release: s.Release}
			for _, l := range s.Leases() {
				h.tokens = append(h.tokens, l.Token())
			}
			return h, nil
		}
	case "advisory":
		l, err := advisory.New(pool, advisory.Config{Owner: "lockset-p" + p})
		if err != nil {
			return err
		}
		defer func() { _ = l.Close(context.WithoutCancel(ctx)) }()
		take = func(ctx context.Context, names []string) (*heldSet, error) {
			keys := make([]advisory.Key, len(names))
			for i, n := range names {
				keys[i] = advisory.Name(n)
			}
			s, err := l.LockAll(ctx, keys...)
			if err != nil {
				return nil, err
			}
			return &heldSet{names: names, tokens: make([]int64, len(names)), valid: func() bool { return s.Err() == nil }, release: s.Unlock}, nil
		}
	default:
		return fmt.Errorf("lockset: mode %q", mode)
	}
	fmt.Println("ready")
	if _, err := pool.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", locksetGate); err != nil {
		return err
	}
	// One emitter per place in a set: proc*16+i holds the i-th name (in
	// byte order) of each of this process's sets, one at a time.
	ems := make([]*check.Emitter, size)
	for i := range ems {
		ems[i] = check.NewEmitter(proc*16+i, os.Stdout)
	}
	rng := rand.New(rand.NewPCG(seed, uint64(proc)))
	all := make([]string, names)
	for i := range all {
		all[i] = "set-" + strconv.Itoa(i)
	}
	n := 0
	var slowest time.Duration
	for end := time.Now().Add(dur); time.Now().Before(end); n++ {
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		ask := slices.Clone(all[:size]) // in random order: AcquireAll orders them
		invoked := check.MonoNow()
		sctx, cancel := context.WithTimeout(ctx, locksetStall)
		t0 := time.Now()
		h, err := take(sctx, ask)
		cancel()
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
		if err != nil {
			return fmt.Errorf("set %d %v: %w", n, ask, err)
		}
		slices.Sort(h.names)
		for i, name := range h.names {
			ems[i].Emit(check.Event{Key: name, Op: check.OpAcquire, Type: check.EvInvoke, Mono: invoked})
			ems[i].Emit(check.Event{Key: name, Op: check.OpAcquire, Type: check.EvOK, Token: h.tokens[i]})
		}
		time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond)))) // the work under the set; not synchronisation
		// The section ends at the last instant the set was seen valid.
		lastValid := check.MonoNow()
		if !h.valid() {
			return fmt.Errorf("set %d %v lost while held", n, h.names)
		}
		for i, name := range h.names {
			ems[i].Emit(check.Event{Key: name, Op: check.OpRelease, Type: check.EvInvoke, Mono: lastValid, Token: h.tokens[i]})
		}
		if err := h.release(ctx); err != nil {
			return fmt.Errorf("set %d %v: release: %w", n, h.names, err)
		}
		for i, name := range h.names {
			ems[i].Emit(check.Event{Key: name, Op: check.OpRelease, Type: check.EvOK, Token: h.tokens[i]})
		}
	}
	pgtest.Printf("sets %d %d", n, slowest)
	return nil
}

// heldSet is a set as the storm uses it, leases or advisory locks.
type heldSet struct {
	names   []string
	tokens  []int64 // by names in byte order; 0 for advisory locks
	valid   func() bool
	release func(context.Context) error
}
