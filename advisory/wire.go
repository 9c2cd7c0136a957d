package advisory

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgbaton/pgbaton/internal/db"
)

// Names of the statements every session connection prepares (readyConn).
const (
	stmtOp     = "pgbaton_advisory_op"
	stmtTry    = "pgbaton_advisory_try"
	stmtUnlock = "pgbaton_advisory_unlock"
)

// readyConn prepares conn to serve as a session: the session statements
// are prepared by name (pgx remembers them, so a connection that was a
// session before costs no round trip) and pgx's read buffers are drained
// so that the session's wire can use the socket directly.
func (l *Locker) readyConn(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
	defer cancel()
	for _, st := range [...]struct{ name, sql string }{
		{stmtOp, db.AdvisoryOpSQL},
		{stmtTry, db.AdvisoryTryOneSQL},
		{stmtUnlock, db.AdvisoryUnlockOneSQL},
	} {
		if _, err := conn.Prepare(ctx, st.name, st.sql); err != nil {
			return mapError("prepare session statements", err)
		}
	}
	if err := conn.PgConn().SyncConn(ctx); err != nil {
		return mapError("prepare session", err)
	}
	return nil
}

// statement is the prepared statement that runs r, on the wire and
// through pgx alike: the two most common requests have their own, without
// the general one's branching. stmtOp takes (op, pair, hi, lo, key, pid),
// the others (key, pid).
func statement(r *request) string {
	switch {
	case r.op == opTry && !r.id.pair:
		return stmtTry
	case r.op == opUnlock && !r.id.pair:
		return stmtUnlock
	}
	return stmtOp
}

// wire speaks the extended query protocol on a session's socket itself.
// pgx, like libpq, lets one goroutine at a time use a connection, so a
// batch could only be sent once the previous one was answered: a session
// had one round trip in flight. On the wire one goroutine sends a batch
// (holding the session's write token) while another reads the results of
// earlier ones (holding the read token); the server always has the next
// batch waiting. pgx keeps the connection and is used again, after the
// wire is drained, for what is rare: releasing everything, parking.
//
// Message framing is pgproto3's; the three statements are prepared by
// readyConn, so a request is a Bind and an Execute, and a batch ends with
// one Sync (one implicit transaction: a failed statement makes the server
// skip the rest of its batch, which the session sends again).
type wire struct {
	nc  net.Conn
	rd  *pgproto3.Frontend // reading only; guarded by the read token
	buf []byte             // encoding buffer; guarded by the write token
	par [6][]byte          // Bind parameters; guarded by the write token
	raw [6][8]byte         // their bytes
}

var binaryFormat = []int16{1}

func newWire(conn *pgx.Conn) *wire {
	nc := conn.PgConn().Conn()
	return &wire{nc: nc, rd: pgproto3.NewFrontend(nc, nil)}
}

// encode appends a batch of requests for the backend pid, and a Sync.
func (w *wire) encode(pid int32, batch []*request) []byte {
	buf := w.buf[:0]
	for _, r := range batch {
		bind := pgproto3.Bind{PreparedStatement: statement(r)}
		if bind.PreparedStatement == stmtOp {
			bind.Parameters = w.params(int4Param(r.op), boolParam(r.id.pair), int4Param(r.id.hi),
				int4Param(r.id.lo), int8Param(r.id.id), int4Param(pid))
		} else {
			bind.Parameters = w.params(int8Param(r.id.id), int4Param(pid))
		}
		bind.ParameterFormatCodes = binaryFormat
		bind.ResultFormatCodes = binaryFormat
		// Encoding fails only for messages larger than the protocol allows.
		buf, _ = bind.Encode(buf)
		buf, _ = (&pgproto3.Execute{}).Encode(buf)
	}
	buf, _ = (&pgproto3.Sync{}).Encode(buf)
	w.buf = buf
	return buf
}

// A Bind parameter in binary format: its length and bytes.
type param struct {
	n int
	v uint64
}

func int8Param(v int64) param { return param{8, uint64(v)} }
func int4Param(v int32) param { return param{4, uint64(uint32(v))} }
func boolParam(v bool) param {
	if v {
		return param{1, 1}
	}
	return param{1, 0}
}

// params lays ps out in the wire's scratch space (Bind.Encode copies them).
func (w *wire) params(ps ...param) [][]byte {
	for i, p := range ps {
		b := w.raw[i][:p.n]
		switch p.n {
		case 8:
			binary.BigEndian.PutUint64(b, p.v)
		case 4:
			binary.BigEndian.PutUint32(b, uint32(p.v))
		default:
			b[0] = byte(p.v)
		}
		w.par[i] = b
	}
	return w.par[:len(ps)]
}

// write sends buf; the caller holds the write token.
func (w *wire) write(buf []byte, timeout time.Duration) error {
	_ = w.nc.SetWriteDeadline(time.Now().Add(timeout))
	_, err := w.nc.Write(buf)
	_ = w.nc.SetWriteDeadline(time.Time{})
	return err
}

// batchOutcome is what the server answered to one batch.
type batchOutcome struct {
	ok       []bool
	failedAt int             // index of the statement that failed, or -1
	pgErr    *pgconn.PgError // its error
	noRow    bool            // a statement's pid guard did not match
}

// errFatal marks a FATAL server error: the backend is gone (terminated,
// shut down) and the socket with it.
var errFatal = errors.New("the server ended the session")

// read reads the answer to a batch of n requests, up to its
// ReadyForQuery. An error means the connection cannot be used any more;
// statement errors are in the outcome. The caller holds the read token.
func (w *wire) read(n int, deadline time.Time) (batchOutcome, error) {
	_ = w.nc.SetReadDeadline(deadline)
	defer func() { _ = w.nc.SetReadDeadline(time.Time{}) }()
	out := batchOutcome{ok: make([]bool, n), failedAt: -1}
	i, rowSeen := 0, false
	for {
		msg, err := w.rd.Receive()
		if err != nil {
			return out, err
		}
		switch msg := msg.(type) {
		case *pgproto3.BindComplete:
		case *pgproto3.DataRow:
			if i < n && len(msg.Values) == 1 && len(msg.Values[0]) == 1 {
				out.ok[i] = msg.Values[0][0] != 0
			}
			rowSeen = true
		case *pgproto3.CommandComplete:
			if !rowSeen {
				out.noRow = true
			}
			i, rowSeen = i+1, false
		case *pgproto3.ErrorResponse:
			pgErr := pgconn.ErrorResponseToPgError(msg)
			if pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" {
				return out, fmt.Errorf("%w: %w", errFatal, pgErr)
			}
			if out.failedAt < 0 {
				out.failedAt, out.pgErr = i, pgErr
			}
		case *pgproto3.ReadyForQuery:
			if out.failedAt < 0 && i != n {
				return out, fmt.Errorf("protocol: %d of %d results before ReadyForQuery", i, n)
			}
			return out, nil
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse:
		default:
			return out, fmt.Errorf("protocol: unexpected %T", msg)
		}
	}
}
