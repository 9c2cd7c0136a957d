package advisory

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// A session on a direct connection (see direct) calls the advisory lock
// functions by the protocol's fast-path function call: one FunctionCall
// message names the function by OID and carries its arguments, and the
// backend runs it without a portal, a plan or an executor. Every try and
// unlock costs the server less than a prepared statement would, and a
// lock handed between clients on one key moves faster than between raw
// pgx clients running SELECT pg_advisory_lock($1): measured on a 2-vCPU
// machine with eight clients on one key (bench: contended scenario), the
// server spends about a sixth less CPU per handover, which pays for the
// session goroutine's hand-offs on the client.
//
// The session statements' token guard (queries/advisory.sql) has no place
// in a function call. It is not needed there: on a direct connection the
// backend is the connection's own for its whole life, which is what the
// guard checks for a connection through a pooler. The pings still check
// the backend, comparing pg_backend_pid() with the one the probe found.
//
// Each call is its own transaction (a FunctionCall is answered up to its
// own ReadyForQuery), so a call that fails leaves the others of its batch
// alone, unlike statements sent up to one Sync.

// encodeCall appends the call of op on id to buf. scratch holds the
// arguments until the message is encoded.
func encodeCall(f *pgsession.Fast, buf []byte, op pgsession.Op, id lockID, scratch *[2][8]byte) []byte {
	fc := pgproto3.FunctionCall{Function: f.OID(op, id.pair), ResultFormatCode: 1}
	var args [2][]byte
	switch {
	case op == pgsession.Ping:
	case id.pair:
		binary.BigEndian.PutUint32(scratch[0][:4], uint32(id.hi))
		binary.BigEndian.PutUint32(scratch[1][:4], uint32(id.lo))
		args[0], args[1] = scratch[0][:4], scratch[1][:4]
		fc.Arguments, fc.ArgFormatCodes = args[:2], binaryArgs[:]
	default:
		binary.BigEndian.PutUint64(scratch[0][:], uint64(id.id))
		args[0] = scratch[0][:]
		fc.Arguments, fc.ArgFormatCodes = args[:1], binaryArgs[:1]
	}
	// Encoding fails only for messages larger than the protocol allows.
	buf, _ = fc.Encode(buf)
	return buf
}

var binaryArgs = [2]uint16{1, 1}

// callAnswer is the server's answer to one function call. The functions
// called return a bool or an int4: their binary result fits in result.
type callAnswer struct {
	result [4]byte
	n      int // bytes of result (0 for NULL)
	err    *pgconn.PgError
}

// readCall reads the answer to one function call, up to its
// ReadyForQuery. An error means the connection cannot be used any more
// (a FATAL error included: the backend is gone).
func readCall(fe *pgproto3.Frontend) (callAnswer, error) {
	var a callAnswer
	for {
		msg, err := fe.Receive()
		if err != nil {
			return a, err
		}
		switch msg := msg.(type) {
		case *pgproto3.FunctionCallResponse:
			// The frontend reuses its buffer: keep what is needed.
			a.n = len(msg.Result)
			copy(a.result[:], msg.Result)
		case *pgproto3.ErrorResponse:
			pgErr := pgconn.ErrorResponseToPgError(msg)
			if pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" {
				return a, fmt.Errorf("%w: %w", errFatal, pgErr)
			}
			a.err = pgErr
		case *pgproto3.ReadyForQuery:
			return a, nil
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse:
		default:
			return a, fmt.Errorf("advisory: protocol: unexpected %T", msg)
		}
	}
}

// boolResult is a bool function's binary result.
func (a callAnswer) boolResult() bool { return a.n == 1 && a.result[0] != 0 }

// int4Result is an int4 function's binary result.
func (a callAnswer) int4Result() (int32, bool) {
	return int32(binary.BigEndian.Uint32(a.result[:])), a.n == 4
}

// fastWait blocks until id is granted on oc's backend, by two calls sent
// together: a try, whose answer says whether the key was held (waited),
// then the blocking lock. When the try succeeds, the lock returns at once
// and the backend holds the key twice: extra says one unlock is owed.
// The wait ends early only when ctx ends: the read is cut and the
// connection closed (see runWait, which cancels on the server first).
func fastWait(ctx context.Context, oc *ownedConn, id lockID, shared bool) (waited, extra bool, err error) {
	pc := oc.conn.PgConn()
	nc := pc.Conn()
	try, lock := pgsession.Try, pgsession.Lock
	if shared {
		try, lock = pgsession.TryShared, pgsession.LockShared
	}
	var scratch [2][8]byte
	buf := encodeCall(oc.fast, nil, try, id, &scratch)
	buf = encodeCall(oc.fast, buf, lock, id, &scratch)
	cutDone := make(chan struct{})
	cut := context.AfterFunc(ctx, func() {
		defer close(cutDone)
		_ = nc.SetDeadline(time.Unix(1, 0)) // ends the read under way
	})
	defer func() {
		if !cut() {
			<-cutDone
			_ = nc.SetDeadline(time.Time{})
		}
	}()
	fail := func(err error) (bool, bool, error) {
		// Where the conversation stands is unknown: the connection must
		// not be used again, and closing it releases what it holds (the
		// socket first: pgx then knows it is closed without writing).
		_ = nc.Close()
		_ = pc.Close(context.Background())
		return false, false, err
	}
	if _, err := nc.Write(buf); err != nil {
		return fail(err)
	}
	tried, err := readCall(pc.Frontend())
	if err != nil {
		return fail(err)
	}
	locked, err := readCall(pc.Frontend())
	switch {
	case err != nil:
		return fail(err)
	case locked.err != nil:
		return true, false, locked.err // cancelled, most likely
	case tried.err != nil:
		return false, false, tried.err
	}
	return !tried.boolResult(), tried.boolResult(), nil
}
