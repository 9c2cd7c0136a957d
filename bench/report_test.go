package main

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestFailedRunsAreReported: an implementation that fails after some runs
// keeps its row (the median of the runs it made) but the report says how
// many runs it made and why it stopped, and no target is judged on it. A
// row of one run used to look like a median of five.
func TestFailedRunsAreReported(t *testing.T) {
	n := 0
	sc := &scenario{
		title:    "Work items: a scenario",
		metrics:  []metric{{name: "items/s", higherBetter: true}},
		noWarmup: true,
		impls: []*impl{
			{name: "pgbaton leasetable Claim", run: func(context.Context) (sample, error) {
				if n++; n > 2 {
					return nil, errors.New("claim: connection reset")
				}
				return sample{"items/s": 100}, nil
			}},
			{name: "raw pgx (same SQL functions)", run: func(context.Context) (sample, error) {
				return sample{"items/s": 110}, nil
			}},
		},
	}
	results := runScenario(context.Background(), sc, 5, func(string, ...any) {})
	var b strings.Builder
	writeTable(&b, sc, results, 5)
	if want := "**pgbaton leasetable Claim: 2 of 5 runs, then failed: claim: connection reset**"; !strings.Contains(b.String(), want) {
		t.Errorf("the table does not say %q:\n%s", want, b.String())
	}
	f := figures{sc.title: results}
	if v := f.median(sc.title, "pgbaton", "items/s"); !math.IsNaN(v) {
		t.Errorf("a target is judged on the failed implementation's %v items/s", v)
	}
	if v := f.median(sc.title, "raw pgx", "items/s"); v != 110 {
		t.Errorf("raw pgx's median is %v, not 110", v)
	}
}

// TestEveryImplementationFollowsEveryOther: a run is timed right after
// whatever ran before it (its WAL, dirty buffers and dead rows), so over
// the runs each implementation follows each other one equally often. The
// rotating order had each always follow the same one: pgbaton's claim
// always ran right after gue's 10k one-row transactions.
func TestEveryImplementationFollowsEveryOther(t *testing.T) {
	for n := 2; n <= 5; n++ {
		rows := n
		if n%2 == 1 {
			rows = 2 * n
		}
		follows := map[[2]int]int{}
		for r := range rows {
			order := runOrder(r, n)
			seen := map[int]bool{}
			for k, i := range order {
				seen[i] = true
				if k > 0 {
					follows[[2]int{order[k-1], i}]++
				}
			}
			if len(seen) != n || len(order) != n {
				t.Fatalf("n=%d run %d: order %v is not a permutation", n, r, order)
			}
		}
		for a := range n {
			for b := range n {
				if want := rows / n; a != b && follows[[2]int{a, b}] != want {
					t.Errorf("n=%d: %d follows %d %d times in %d runs, want %d", n, b, a, follows[[2]int{a, b}], rows, want)
				}
			}
		}
	}
}

// TestMachineTicks: the fleet's machine CPU column reads /proc/stat, and
// its busy time grows while this test spins.
func TestMachineTicks(t *testing.T) {
	a := readMachineTicks()
	if a.busy < 0 || a.steal < 0 {
		t.Fatalf("/proc/stat not read: %+v", a)
	}
	deadline := time.Now().Add(10 * time.Second)
	for x := 0; readMachineTicks().busy <= a.busy; x++ {
		if time.Now().After(deadline) {
			t.Fatal("busy time did not grow while spinning")
		}
		for i := range 1_000_000 {
			x ^= i
		}
	}
}
