// Package ha is pgbaton's HA test bed: the workload of advisory lockers,
// lease holders doing fenced writes, claimers working items and an
// election, all through one multi-host URL
// (target_session_attrs=read-write), against a real Patroni cluster on
// loopback (internal/testkit/hacluster), through a switchover, failovers (SIGKILL
// of the leader's node) in asynchronous and synchronous mode and with a
// lagging asynchronous standby, and a crash of the leader's PostgreSQL
// restarted in place.
//
// After each nemesis the suite checks the history with test/check's
// checkers (no two valid holders overlap, no stale token accepted by a
// fenced write, no work item lost or doubled, tokens never go backwards),
// that two holders taking turns on one lease through the fault never hold
// it at once as they see it (acquired → told lost; holder_test.go), and
// liveness (every client works again within the failover time + the
// failover grace the fault imposed + 2 s; advisory holders are told
// within PingInterval + PingTimeout), and prints one line per nemesis:
//
//	ha: failover  failover_ms 5756 grace_ms 10000 clients_ok_ms 17000 (bound 18535) told_ms 70 (bound 1500) token 1099511628520(e1+744) -> 2199023256329(e2+777) overlaps 0 holder_overlaps 0 (longest 0 ms) ...
//
// (a token is epoch * 2^40 + sequence: pgbaton.next_token).
//
// It needs the Debian packages patroni and etcd-server and runs only
// with the build tag ha:
//
//	make test-ha                     # installs them when missing (as root)
//	go test -tags ha -v ./test/ha/   # once they are installed
package ha
