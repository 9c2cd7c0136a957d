// Package hacluster starts a throwaway highly available PostgreSQL cluster
// on loopback for the HA test bed (test/ha): one etcd and N nodes, each a
// Patroni managing its own PostgreSQL, as production clusters run them.
// It needs the Debian packages patroni and etcd-server (see Requirements).
//
// Everything lives in one temporary directory and listens on free loopback
// ports. When the caller is root, etcd, Patroni and PostgreSQL run as the
// unprivileged user "postgres" (or "nobody"), because PostgreSQL refuses
// to run as root.
//
// Nothing outlives the cluster. Every process the cluster starts carries
// the directory's unique name in its command line (PostgreSQL's children
// through cluster_name, which Patroni sets to the scope), so they can all
// be found, including the postmasters Patroni starts in sessions of their
// own and backends orphaned by a killed postmaster. Stop kills them all
// and removes the directory; a watchdog process does the same when the
// starting process ends in any other way (a panic, os.Exit, SIGKILL), as
// in internal/pgcluster. Leftovers lists what is still running, for tests
// that check that nothing was left.
//
// Replication goes through an in-process TCP fault proxy in front of each
// node (its Patroni connect_address), so a test can make a replica lag by
// stalling the leader's replication traffic; clients connect to the nodes
// directly (URL).
package hacluster
