package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMain runs the smoke test against a throwaway PostgreSQL: without
// PGBATON_DSN it runs itself again under the root module's withpg, which
// starts a migrated cluster and removes it afterwards. It also serves as
// the lock-holding child process of the SIGKILL scenarios.
func TestMain(m *testing.M) {
	if mode := os.Getenv("BENCH_CHILD"); mode != "" {
		if err := runChild(mode, os.Getenv("BENCH_CHILD_KEY")); err != nil {
			os.Stderr.WriteString("bench child: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("PGBATON_DSN") == "" {
		cmd := exec.Command("go", append([]string{"run", "github.com/pgbaton/pgbaton/internal/testkit/withpg", "--", os.Args[0]}, os.Args[1:]...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			if exit, ok := err.(*exec.ExitError); ok {
				os.Exit(exit.ExitCode())
			}
			os.Stderr.WriteString("bench: withpg: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario once, tiny, so that CI keeps the harness
// and every implementation working. It asserts that each produced a
// figure (or a printed reason to skip), never how fast anything is.
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	report, err := benchmark(ctx, os.Getenv("PGBATON_DSN"), options{
		runs: 1, window: 50 * time.Millisecond, samples: 3, killRuns: 2, rows: 200, backlog: 300, holds: "1,10",
		keep: "100", keepHold: time.Second, keepRaw: 100,
		fleet: "5", fleetWin: 500 * time.Millisecond, pause: 10 * time.Millisecond, poll: 100 * time.Millisecond,
		contend: 300 * time.Millisecond,
	}, &log)
	if err != nil {
		t.Fatalf("benchmark: %v\n%s", err, log.String())
	}
	e := &env{window: time.Millisecond, samples: 1, killRuns: 1, rows: 200, backlog: 300, holds: []int{1, 10},
		keepAlive: []int{100}, keepRaw: 100, fleet: []int{5}, fleetPoll: 100 * time.Millisecond}
	for _, sc := range e.scenarios() {
		if !strings.Contains(report, "### "+sc.title+"\n") {
			t.Errorf("report lacks %q", sc.title)
		}
		for _, im := range sc.impls {
			if !strings.Contains(report, "| "+im.name+" |") {
				t.Errorf("%s: no row for %s", sc.title, im.name)
			}
		}
	}
	// Losing a lease is a bug, not a slow run: the keep-alive scenarios
	// must keep every one.
	for _, line := range strings.Split(report, "\n") {
		if strings.HasPrefix(line, "| one client keeps ") && !strings.HasSuffix(line, "| met |") {
			t.Errorf("keep-alive target not met: %s", line)
		}
	}
	if strings.Contains(report, "failed:") {
		t.Errorf("some implementation failed:\n%s", report)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("report:\n%s\nlog:\n%s", report, log.String())
	}
}
