// Package pgsession is a connection an advisory Locker owns for good
// (Conn): it is opened and probed, runs lock operations for many callers,
// blocks in a wait, releases everything and closes, and Done says when it
// has ended and its locks with it. It knows nothing of the Locker's
// bookkeeping (which goroutine holds which key).
//
//   - ops.go: the operations, defined once (op codes, functions, statements)
//   - conn.go: Open: take a connection from the pool, probe it, refuse an
//     unsafe one
//   - session.go: the goroutine that owns the connection: batches,
//     pipelining, pings, waits, the end
//   - wire.go: the bytes: prepared statements, or fast-path function calls
//     on a direct connection
package pgsession

import "github.com/pgbaton/pgbaton/internal/db"

// Op is an operation a session runs on a key.
type Op int32

// The operations. Ping..UnlockShared are AdvisoryOp's op codes
// (queries/advisory.sql, checked by TestOpTableMatchesSQL); Lock and
// LockShared block, and only a wait runs them.
const (
	Ping Op = iota
	Try
	TryShared
	Unlock
	UnlockShared
	Lock
	LockShared
	numOps
)

// opSpec is what one operation calls and how it is sent.
type opSpec struct {
	name string // in statement names
	// fn is the function run on the key (for Ping: with no arguments).
	// The fast path looks it up by signature, for a bigint key and for a
	// pair of int4 keys; the statements call it by name.
	fn string
	// one, if set, is a statement of its own for a bigint key, without
	// AdvisoryOp's branching: the most common requests.
	one string
}

// ops is the one table of operations: the fast path's function list, the
// statement names and the statements each request runs derive from it.
var ops = [numOps]opSpec{
	Ping:         {name: "ping", fn: "pg_backend_pid"},
	Try:          {name: "try", fn: "pg_try_advisory_lock", one: db.AdvisoryTryOneSQL},
	TryShared:    {name: "try_shared", fn: "pg_try_advisory_lock_shared"},
	Unlock:       {name: "unlock", fn: "pg_advisory_unlock", one: db.AdvisoryUnlockOneSQL},
	UnlockShared: {name: "unlock_shared", fn: "pg_advisory_unlock_shared"},
	Lock:         {name: "lock", fn: "pg_advisory_lock"},
	LockShared:   {name: "lock_shared", fn: "pg_advisory_lock_shared"},
}

// signature is the regprocedure of op's function for a bigint key or a
// pair of int4 keys.
func (op Op) signature(pair bool) string {
	switch {
	case op == Ping:
		return ops[op].fn + "()"
	case pair:
		return ops[op].fn + "(integer, integer)"
	}
	return ops[op].fn + "(bigint)"
}

// FastPathFunctions are the functions a direct session calls, for
// AdvisoryFastPathFunctions: each operation's for a bigint key, then for
// a pair (Fast.OID's order).
func FastPathFunctions() []string {
	fns := make([]string, 0, 2*numOps)
	for _, pair := range []bool{false, true} {
		for op := range numOps {
			fns = append(fns, op.signature(pair))
		}
	}
	return fns
}

// Fast are the OIDs of the functions a direct session calls.
//
// The fast path: on a direct connection, whose backend is its own for
// life, a session calls pg_try_advisory_lock, pg_advisory_lock,
// pg_advisory_unlock and their shared and two-key forms by the protocol's
// fast-path function call: one message per operation, which the backend
// runs without a parse, a plan, a portal or an executor (a blocking wait
// sends its try and its lock in one write). Through a pooler or proxy,
// sessions run the token-guarded prepared statements of
// queries/advisory.sql instead.
type Fast [2][numOps]uint32

// NewFast takes the OIDs AdvisoryFastPathFunctions returned for
// FastPathFunctions; nil if they are not what was asked for (the
// session then runs the statements).
func NewFast(oids []int64) *Fast {
	var f Fast
	if len(oids) != 2*int(numOps) {
		return nil
	}
	for i, o := range oids {
		if o <= 0 || o > 1<<32-1 {
			return nil
		}
		f[i/int(numOps)][i%int(numOps)] = uint32(o)
	}
	return &f
}

// OID is the function op calls on a bigint key, or on a pair.
func (f *Fast) OID(op Op, pair bool) uint32 {
	if pair {
		return f[1][op]
	}
	return f[0][op]
}

// Statements are the names a connection prepares its statements under,
// by operation. They carry the connection's token, so that they can
// never clash with statements a previous client left on a backend a
// pooler hands on. General is AdvisoryOp's.
type Statements struct {
	General string
	one     [numOps]string
}

// NamesFor names the statements of a connection with token.
func NamesFor(token string) Statements {
	n := Statements{General: "pgbaton_op_" + token}
	for op, spec := range ops {
		if spec.one != "" {
			n.one[op] = "pgbaton_" + spec.name + "_" + token
		}
	}
	return n
}

// Parse lists the statements to prepare: name and text.
func (n *Statements) Parse() [][2]string {
	out := [][2]string{{n.General, db.AdvisoryOpSQL}}
	for op, spec := range ops {
		if spec.one != "" {
			out = append(out, [2]string{n.one[op], spec.one})
		}
	}
	return out
}

// For is the statement that runs op: its own for a bigint key when it
// has one (taking key, token), else General (op, pair, hi, lo, key,
// token).
func (n *Statements) For(op Op, pair bool) string {
	if !pair && n.one[op] != "" {
		return n.one[op]
	}
	return n.General
}

// Key is a resolved advisory key, what Postgres sees: one bigint (ID), or
// a pair of int4 (Pair, Hi, Lo).
type Key struct {
	Pair   bool
	ID     int64
	Hi, Lo int32
}
