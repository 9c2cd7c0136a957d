// Package test holds pgbaton's cross-package integration and fault-injection
// tests; it has no exported API.
//
// The chaos suite (chaos_test.go) is Jepsen-style: worker processes (the
// test binary re-executed) take leases, write to a ledger table under their
// fencing tokens and record every operation as invoke / ok / fail / unknown
// in a history; a seeded nemesis SIGKILLs and SIGSTOPs workers, terminates
// their backends, cuts, stalls and slows their TCP connections, restarts
// the cluster in immediate mode and kills idle sessions; checkers then
// verify mutual exclusion (porcupine against a mutex model, and an
// interval check), fencing (porcupine against a fenced lease model, and the
// ledger against the acknowledged writes), liveness (takeover within a
// bound after every fault) and leaks.
//
// The same run covers advisory session locks under the faults they are
// specified to survive (kill, pause, stall, slow);
// TestAdvisoryServerSideLossWindow measures the window the others open.
// TestCheckersBite runs a deliberately broken worker (no validity check, no
// fence) and requires the checkers to fail it.
//
// Every operation is stamped with the host's CLOCK_MONOTONIC, one clock for
// the parent and all workers, never a process's own wall clock. Each run
// prints one line:
//
//	chaos: seed S ops N faults F overlaps 0 stale_accepted 0 lost 0 doubled 0 max_takeover_ms X
//
// Running it:
//
//	go test -race -run TestChaos ./test/                       # short run (also in make test)
//	make chaos CHAOS_SEEDS=8 CHAOS_DURATION=2m                 # long run, many seeds
//	go test -run TestChaos ./test/ -args -chaos.seed=1234      # replay a seed's schedule
//
// A run with a violation (or with CHAOS_HISTORY=1) writes its history and
// faults as JSON lines to chaos-history-SEED.jsonl in the temp directory.
// The seed fixes the nemesis's schedule (kinds, gaps, durations, choices);
// the interleaving of the workers still varies from run to run.
//
// TestKillStormHistory is leasetable's kill storm (work items, effect and
// CompleteTx in one transaction, workers SIGKILLed at random) with a
// history, checked here as porcupine is no dependency of the library.
//
// TestLockSetStorm has 16 processes, each with its own pool and client,
// take random 3-name sets of 10 names as all-or-nothing sets
// (leasetable.AcquireAll, then advisory.LockAll): no set waits 30 s (a
// deadlock), no name has two holders (check.Overlaps over every member of
// every set), every process gets sets. It runs 5 s in make test; make
// locksets runs it for a minute and prints throughput and fairness:
//
//	lock-set storm (lease): 16 processes, 3-name sets of 10 names, 1m0s: N sets, X sets/s, per process MIN..MAX (fairness MAX/MIN), slowest set D, ...
//
// Also here: PgBouncer in transaction pooling mode (pgbouncer_test.go), the
// lock table filled to SQLSTATE 53200 (locktable_test.go), and the check of
// the key-hashing fuzz corpus against SQL (keys_test.go; the fuzz targets
// are in test/fuzz).
package test
