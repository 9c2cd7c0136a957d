// Package testkit holds pgbaton's test harness, which never enters a
// service's build: the library packages never import it (a test in the root
// package checks), only tests, test/, bench/, the demo and `make` targets do.
//
//   - pgcluster: throwaway PostgreSQL clusters from the installed server
//     binaries, which never outlive the process that started them.
//   - pgtest: the per-test-binary environment (one cluster, a migrated
//     template, a database per test, child processes, leak checks) and its
//     PgBouncer helper.
//   - hacluster: a throwaway Patroni cluster with etcd (make test-ha).
//   - faultproxy: a TCP proxy that injects faults between client and server.
//   - metertest: an OpenTelemetry meter whose readings tests can check.
//   - withpg: a command that runs another against a throwaway migrated
//     cluster (sqlc vet, benchmarks).
//
// A helper that the tests of more than one package need (pgtest.Context,
// pgtest.Env.ProxiedPool, metertest) lives here once, not copied into
// each package.
//
// It sits under internal/ of the root module so that every module of the
// repository (the root's package tests, cmd/pgbaton, gocronlock, test/,
// bench/, examples/demo) can import it: Go's internal rule goes by import
// path, not by module.
package testkit
