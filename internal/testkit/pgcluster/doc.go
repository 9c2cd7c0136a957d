// Package pgcluster starts throwaway PostgreSQL clusters from the server
// binaries installed on the machine (initdb and postgres), or those in
// $PGBATON_PG_BINDIR, for tests, the demo and benchmarks. It needs no
// client tools: a standby's base backup is a copy of the primary's data
// directory in backup mode, so a server-only install of any supported
// major (what `make test-matrix` installs) runs every test that uses it.
//
// A cluster lives in its own temporary directory, listens on 127.0.0.1 on a
// free port and on a unix socket inside that directory, and is removed by
// Stop. It also never outlives the process that started it: a small
// watchdog process holds the read end of a pipe whose write end only the
// starting process has open. When that process ends for any reason (Stop,
// a panic, os.Exit, SIGINT, SIGTERM, SIGKILL) the pipe closes, and the
// watchdog shuts the server down and removes the directory.
//
// When the current user is root, the server runs as the unprivileged system
// user "postgres" (or "nobody" when there is none), because initdb and
// postgres refuse to run as root.
//
// With Config.FakeClock the server runs with libfaketime preloaded, and
// StepClock steps its wall clock (clock_timestamp(), now()) for every
// backend at once, as an NTP step or a VM resume would, leaving its
// monotonic clock alone: the clock-step tests of leasetable use it.
package pgcluster
