package advisory

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgbaton/pgbaton/internal/db"
)

// stmtNames are the names a connection prepares the session statements
// under. They carry the connection's token, so that they can never clash
// with statements a previous client left on a backend a pooler hands on.
type stmtNames struct{ op, try, unlock string }

func namesFor(token string) stmtNames {
	return stmtNames{op: "pgbaton_op_" + token, try: "pgbaton_try_" + token, unlock: "pgbaton_unlock_" + token}
}

// statement is the prepared statement that runs r: the two most common
// requests have their own, without the general one's branching. op takes
// (op, pair, hi, lo, key, token), the others (key, token).
func (n *stmtNames) statement(r *request) string {
	switch {
	case r.op == opTry && !r.id.pair:
		return n.try
	case r.op == opUnlock && !r.id.pair:
		return n.unlock
	}
	return n.op
}

// readyConn makes a probed connection the Locker's, in one round trip:
// the TCP settings, application_name and token are set (see
// queries/advisory.sql), and the session statements are prepared. It
// speaks the protocol through the connection's own pgproto3.Frontend, so
// pgx's view of the connection stays exact.
func (l *Locker) readyConn(ctx context.Context, oc *ownedConn) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	pc := oc.conn.PgConn()
	nc := pc.Conn()
	st := l.cfg.serverTimeouts()
	settings := [][]byte{
		[]byte(strconv.Itoa(st.keepalivesIdle)), []byte(strconv.Itoa(st.keepalivesInterval)),
		[]byte(strconv.Itoa(st.keepalivesCount)), []byte(strconv.Itoa(st.userTimeout)),
		[]byte(l.cfg.applicationName()), []byte(oc.token),
	}
	var buf []byte
	for _, p := range []pgproto3.Parse{
		{Name: oc.names.op, Query: db.AdvisoryOpSQL},
		{Name: oc.names.try, Query: db.AdvisoryTryOneSQL},
		{Name: oc.names.unlock, Query: db.AdvisoryUnlockOneSQL},
		{Query: db.AdvisorySessionReadySQL},
	} {
		buf, _ = p.Encode(buf)
	}
	buf, _ = (&pgproto3.Bind{Parameters: settings}).Encode(buf)
	buf, _ = (&pgproto3.Execute{}).Encode(buf)
	buf, _ = (&pgproto3.Sync{}).Encode(buf)
	_ = nc.SetDeadline(deadline)
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	if _, err := nc.Write(buf); err != nil {
		return fmt.Errorf("advisory: prepare session: %w", err)
	}
	var failed *pgconn.PgError
	for {
		msg, err := pc.Frontend().Receive()
		if err != nil {
			return fmt.Errorf("advisory: prepare session: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			if failed == nil {
				failed = pgconn.ErrorResponseToPgError(msg)
			}
		case *pgproto3.ReadyForQuery:
			if failed != nil {
				return mapError("prepare session", failed)
			}
			return nil
		}
	}
}

// wire speaks the extended query protocol on a session's connection for
// the session's goroutine: it encodes a batch of requests (a Bind and an
// Execute of a statement prepared by readyConn each, and one Sync) and
// reads the answers. pgx, like libpq, waits for each answer before it
// sends more, and pays for generality the session does not need; the
// session keeps batches on the wire back to back instead. Answers are
// read through the connection's own pgproto3.Frontend, whose buffer pgx
// shares, so pgx can be used again on the connection between batches (to
// wait for a lock, to release everything).
type wire struct {
	nc    net.Conn
	fe    *pgproto3.Frontend
	names stmtNames
	token []byte
	buf   []byte    // encoding buffer
	par   [6][]byte // Bind parameters
	raw   [6][8]byte
}

var binaryFormat = []int16{1}

func newWire(oc *ownedConn) wire {
	pc := oc.conn.PgConn()
	return wire{nc: pc.Conn(), fe: pc.Frontend(), names: oc.names, token: []byte(oc.token)}
}

// encode lays out a batch of requests and a Sync. The batch is one
// implicit transaction: a statement that fails makes the server skip the
// rest of the batch, which the session sends again.
func (w *wire) encode(batch []*request) []byte {
	buf := w.buf[:0]
	for _, r := range batch {
		bind := pgproto3.Bind{PreparedStatement: w.names.statement(r)}
		if bind.PreparedStatement == w.names.op {
			bind.Parameters = w.params(int4Param(r.op), boolParam(r.id.pair), int4Param(r.id.hi),
				int4Param(r.id.lo), int8Param(r.id.id))
		} else {
			bind.Parameters = w.params(int8Param(r.id.id))
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

// params lays ps out in the wire's scratch space, followed by the token
// every statement takes last (Bind.Encode copies them).
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
	w.par[len(ps)] = w.token
	return w.par[:len(ps)+1]
}

// write sends buf.
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
	noRow    bool            // a statement's token guard did not match
}

// errFatal marks a FATAL server error: the backend is gone (terminated,
// shut down) and the socket with it.
var errFatal = errors.New("the server ended the session")

// read reads the answer to a batch of n requests, up to its
// ReadyForQuery. An error means the connection cannot be used any more;
// statement errors are in the outcome.
func (w *wire) read(n int, deadline time.Time) (batchOutcome, error) {
	_ = w.nc.SetReadDeadline(deadline)
	defer func() { _ = w.nc.SetReadDeadline(time.Time{}) }()
	out := batchOutcome{ok: make([]bool, n), failedAt: -1}
	i, rowSeen := 0, false
	for {
		msg, err := w.fe.Receive()
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
