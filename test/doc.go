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
// interval check), fencing (the ledger against the acknowledged writes),
// liveness (takeover within a bound after every fault) and leaks.
//
//	go test -race -run TestChaos ./test/                       # short run
//	go test -run TestChaos ./test/ -args -chaos.seeds=10 -chaos.duration=2m
//	go test -run TestChaos ./test/ -args -chaos.seed=1234      # replay a seed
package test
