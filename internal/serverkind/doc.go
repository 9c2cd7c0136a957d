// Package serverkind tells PostgreSQL from servers that speak its
// protocol but do not keep the promises pgbaton relies on, so that
// advisory.Locker and leasetable.Client refuse them with
// pgbaton.ErrUnsupportedServer instead of handing out locks that lock
// nothing:
//
//   - CockroachDB accepts pg_advisory_lock and friends and returns at
//     once without locking anything (they are no-ops kept for
//     compatibility), so two holders would both "hold" every key.
//   - YugabyteDB caches sequence values per connection (ysql_sequence_cache
//     size), so values from one BIGSERIAL are not monotonic across
//     connections, and fencing tokens would go backwards.
//
// Detection uses what the server says about itself: the ParameterStatus
// values it sends at startup (CockroachDB sends crdb_version; YugabyteDB's
// server_version carries "-YB-") and, to be sure, version(). Both survive
// a pooler in between (PgBouncer replays the server's startup parameters).
package serverkind
