package pgsession

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/db"
)

// ready makes a probed connection the Locker's, in one round trip:
// the TCP settings, application_name and token are set (see
// queries/advisory.sql), and the session statements are prepared; on a
// direct connection, the functions the fast path calls are looked up
// (see the fast path below). It speaks the protocol through the connection's own
// pgproto3.Frontend, so pgx's view of the connection stays exact.
func (s *Conn) ready(parent context.Context, direct bool) error {
	ctx, cancel := context.WithTimeout(parent, s.cfg.PingTimeout)
	defer cancel()
	// The socket's deadline is the context's: when it fires, the read
	// fails with a bare i/o timeout, so the caller's own cause is put in
	// the chain for errors.Is(err, context.DeadlineExceeded) to hold.
	// The socket's timer can fire before the context's has marked it done.
	ioFailed := func(err error) error {
		cause := context.Cause(parent)
		if d, ok := parent.Deadline(); cause == nil && ok && !time.Now().Before(d) {
			cause = context.DeadlineExceeded
		}
		if cause != nil {
			return fmt.Errorf("advisory: prepare session: %w (%w)", cause, err)
		}
		return fmt.Errorf("advisory: prepare session: %w", err)
	}
	deadline, _ := ctx.Deadline()
	pc := s.conn.PgConn()
	nc := pc.Conn()
	st := s.cfg.serverTimeouts()
	settings := [][]byte{
		[]byte(strconv.Itoa(st.keepalivesIdle)), []byte(strconv.Itoa(st.keepalivesInterval)),
		[]byte(strconv.Itoa(st.keepalivesCount)), []byte(strconv.Itoa(st.userTimeout)),
		[]byte(s.cfg.AppName), []byte(s.token),
	}
	var buf []byte
	for _, p := range s.names.Parse() {
		buf, _ = (&pgproto3.Parse{Name: p[0], Query: p[1]}).Encode(buf)
	}
	buf, _ = (&pgproto3.Parse{Query: db.AdvisorySessionReadySQL}).Encode(buf)
	buf, _ = (&pgproto3.Bind{Parameters: settings}).Encode(buf)
	buf, _ = (&pgproto3.Execute{}).Encode(buf)
	if direct {
		buf, _ = (&pgproto3.Parse{Query: db.AdvisoryFastPathFunctionsSQL}).Encode(buf)
		fns := `{"` + strings.Join(FastPathFunctions(), `","`) + `"}` // a text[] literal
		buf, _ = (&pgproto3.Bind{Parameters: [][]byte{[]byte(fns)}, ResultFormatCodes: binaryFormat}).Encode(buf)
		buf, _ = (&pgproto3.Execute{}).Encode(buf)
	}
	buf, _ = (&pgproto3.Sync{}).Encode(buf)
	_ = nc.SetDeadline(deadline)
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	if _, err := nc.Write(buf); err != nil {
		return ioFailed(err)
	}
	var failed *pgconn.PgError
	for {
		msg, err := pc.Frontend().Receive()
		if err != nil {
			return ioFailed(err)
		}
		switch msg := msg.(type) {
		case *pgproto3.DataRow: // the fast path's functions
			var oids []int64
			if len(msg.Values) == 1 && s.conn.TypeMap().Scan(pgtype.Int8ArrayOID, pgtype.BinaryFormatCode, msg.Values[0], &oids) == nil {
				s.fast = NewFast(oids)
			}
		case *pgproto3.ErrorResponse:
			if failed == nil {
				failed = pgconn.ErrorResponseToPgError(msg)
			}
		case *pgproto3.ReadyForQuery:
			if failed != nil {
				return MapError("prepare session", failed)
			}
			return nil
		}
	}
}

// wire speaks the extended query protocol on a session's connection for
// the session's goroutine: it encodes a batch of requests (a Bind and an
// Execute of a statement prepared by ready each, and one Sync) and
// reads the answers. pgx, like libpq, waits for each answer before it
// sends more, and pays for generality the session does not need; the
// session keeps batches on the wire back to back instead. Answers are
// read through the connection's own pgproto3.Frontend, whose buffer pgx
// shares, so pgx can be used again on the connection between batches (to
// wait for a lock, to release everything). On a direct connection the
// requests are function calls instead (see the fast path below).
type wire struct {
	nc    net.Conn
	fe    *pgproto3.Frontend
	names Statements
	token []byte
	fast  *Fast     // nil: prepared statements
	pid   int32     // the backend a fast ping must find
	buf   []byte    // encoding buffer
	par   [6][]byte // Bind parameters
	raw   [6][8]byte
}

var binaryFormat = []int16{1}

func newWire(s *Conn) wire {
	pc := s.conn.PgConn()
	return wire{nc: pc.Conn(), fe: pc.Frontend(), names: s.names, token: []byte(s.token), fast: s.fast, pid: s.pid}
}

// encode lays out a batch of requests: function calls, or statements and
// a Sync. Statements up to a Sync are one implicit transaction: one that
// fails makes the server skip the rest of the batch, which the session
// sends again.
func (w *wire) encode(batch []*request) []byte {
	buf := w.buf[:0]
	if w.fast != nil {
		var scratch [2][8]byte
		for _, r := range batch {
			buf = encodeCall(w.fast, buf, r.op, r.id, &scratch)
		}
		w.buf = buf
		return buf
	}
	for _, r := range batch {
		bind := pgproto3.Bind{PreparedStatement: w.names.For(r.op, r.id.Pair)}
		if bind.PreparedStatement == w.names.General {
			bind.Parameters = w.params(int4Param(int32(r.op)), boolParam(r.id.Pair), int4Param(r.id.Hi),
				int4Param(r.id.Lo), int8Param(r.id.ID))
		} else {
			bind.Parameters = w.params(int8Param(r.id.ID))
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
	failedAt int             // index of the first request that failed, or -1
	pgErr    *pgconn.PgError // its error
	noRow    bool            // a statement's token guard (or a fast ping) did not match
	// calls: the requests were function calls, each its own transaction:
	// those after a failed one ran, and may have failed too (errs).
	calls bool
	errs  []*pgconn.PgError
}

// answer is how request i fared: its error, or whether it must be sent
// again (skipped by the server after an earlier statement failed).
func (o *batchOutcome) answer(i int) (pgErr *pgconn.PgError, retry bool) {
	switch {
	case o.calls:
		return o.errs[i], false
	case o.failedAt < 0 || i < o.failedAt:
		return nil, false
	case i == o.failedAt:
		return o.pgErr, false
	}
	return nil, true
}

// errFatal marks a FATAL server error: the backend is gone (terminated,
// shut down) and the socket with it.
var errFatal = errors.New("advisory: the server ended the session")

// read reads the answer to a batch of n requests, up to its
// ReadyForQuery. An error means the connection cannot be used any more;
// statement errors are in the outcome.
func (w *wire) read(batch []*request, deadline time.Time) (batchOutcome, error) {
	_ = w.nc.SetReadDeadline(deadline)
	defer func() { _ = w.nc.SetReadDeadline(time.Time{}) }()
	n := len(batch)
	out := batchOutcome{ok: make([]bool, n), failedAt: -1}
	if w.fast != nil {
		return w.readCalls(batch, out)
	}
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
				return out, fmt.Errorf("advisory: protocol: %d of %d results before ReadyForQuery", i, n)
			}
			return out, nil
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse:
		default:
			return out, fmt.Errorf("advisory: protocol: unexpected %T", msg)
		}
	}
}

// readCalls reads the answers to a batch of function calls.
func (w *wire) readCalls(batch []*request, out batchOutcome) (batchOutcome, error) {
	out.calls, out.errs = true, make([]*pgconn.PgError, len(batch))
	for i, r := range batch {
		a, err := readCall(w.fe)
		if err != nil {
			return out, err
		}
		switch {
		case a.err != nil:
			out.errs[i] = a.err
			if out.failedAt < 0 {
				out.failedAt, out.pgErr = i, a.err
			}
		case r.op == Ping:
			// The backend must still be the one the probe found: the
			// fast path's version of the statements' token guard.
			pid, ok := a.int4Result()
			out.ok[i] = ok && pid == w.pid
			out.noRow = out.noRow || !out.ok[i]
		default:
			out.ok[i] = a.boolResult()
		}
	}
	return out, nil
}

// A session on a direct connection (see direct) calls the advisory lock
// functions by the protocol's fast-path function call: one FunctionCall
// message names the function by OID and carries its arguments, and the
// backend runs it without a portal, a plan or an executor. Every try and
// unlock costs the server less than a prepared statement would, and a
// lock handed between clients on one key moves faster than between raw
// pgx clients running SELECT pg_advisory_lock($1): measured on a 2-vCPU
// machine with eight clients on one key (bench: contended scenario), the
// server spends about a sixth less CPU per handover.
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
func encodeCall(f *Fast, buf []byte, op Op, id Key, scratch *[2][8]byte) []byte {
	fc := pgproto3.FunctionCall{Function: f.OID(op, id.Pair), ResultFormatCode: 1}
	var args [2][]byte
	switch {
	case op == Ping:
	case id.Pair:
		binary.BigEndian.PutUint32(scratch[0][:4], uint32(id.Hi))
		binary.BigEndian.PutUint32(scratch[1][:4], uint32(id.Lo))
		args[0], args[1] = scratch[0][:4], scratch[1][:4]
		fc.Arguments, fc.ArgFormatCodes = args[:2], binaryArgs[:]
	default:
		binary.BigEndian.PutUint64(scratch[0][:], uint64(id.ID))
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

// fastWait blocks until id is granted on the backend: one call of the
// blocking lock function, sent alone. A try sent first would tell
// whether the key was held, but costs the server a call (its own
// transaction) per acquisition: with eight clients taking turns on one
// key, 6,030-6,513 acquisitions/s with the try against 6,607-6,746
// without (bench, contended scenario, 3 rounds of 5 runs, the two
// builds alternating on one cluster). waited is judged from the time
// the grant took instead (see waitedAfter).
// The wait ends early only when ctx ends: the read is cut and the
// connection closed (see runWait, which cancels on the server first).
func (s *Conn) fastWait(ctx context.Context, id Key, shared bool) (waited bool, err error) {
	pc := s.conn.PgConn()
	nc := pc.Conn()
	lock := Lock
	if shared {
		lock = LockShared
	}
	var scratch [2][8]byte
	buf := encodeCall(s.fast, nil, lock, id, &scratch)
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
	fail := func(err error) (bool, error) {
		// Where the conversation stands is unknown: the connection must
		// not be used again, and closing it releases what it holds (the
		// socket first: pgx then knows it is closed without writing).
		_ = nc.Close()
		_ = pc.Close(context.Background())
		return false, err
	}
	start := time.Now()
	if _, err := nc.Write(buf); err != nil {
		return fail(err)
	}
	locked, err := readCall(pc.Frontend())
	switch {
	case err != nil:
		return fail(err)
	case locked.err != nil:
		return true, locked.err // cancelled, most likely
	}
	return time.Since(start) > s.waitedAfter(), nil
}
