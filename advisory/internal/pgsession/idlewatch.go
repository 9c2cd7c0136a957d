package pgsession

import (
	"net"
	"syscall"
	"time"
)

// idleWatchAfter is how long a session is idle before it watches its
// socket. Loops that lock and unlock in a row never pay for the watch;
// a holder that keeps a lock learns of a server that ended its session
// (a shutdown, a switchover, pg_terminate_backend) within about this
// long, instead of at the next ping. It was a millisecond; but waits on
// a contended key often last one, and a watch timer firing in every
// wait woke the session's goroutine once per handover, a thread woken
// on a busy machine that raw pgx does not pay. Against a switchover,
// whose new primary takes a second or more to grant anything, 10ms is as
// good.
const idleWatchAfter = 10 * time.Millisecond

// idleWatch waits, on a goroutine of its own, until an idle session's
// socket becomes readable. While a session is idle the server sends
// nothing unless it ends the session (FATAL then EOF, or a reset), so
// readable means: look now. It peeks and consumes nothing; the session's
// next read gets every byte.
type idleWatch struct {
	nc       net.Conn
	readable chan struct{} // closed when the socket became readable
	done     chan struct{} // closed when the goroutine has returned
}

// startIdleWatch watches nc, or returns nil when nc offers no raw
// descriptor to wait on (the session then relies on its pings alone).
func startIdleWatch(nc net.Conn) *idleWatch {
	if !canWatchIdle {
		return nil
	}
	raw := rawConnOf(nc)
	if raw == nil {
		return nil
	}
	w := &idleWatch{nc: nc, readable: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		if waitReadable(raw) {
			close(w.readable)
		}
	}()
	return w
}

// stop ends the watch before the session uses the socket again: the
// read deadline wakes the waiting goroutine, which is gone before stop
// returns, so the session's own reads and deadlines are its alone.
func (w *idleWatch) stop() {
	_ = w.nc.SetReadDeadline(time.Unix(1, 0))
	<-w.done
	_ = w.nc.SetReadDeadline(time.Time{})
}

// rawConnOf is the descriptor under nc, through TLS.
func rawConnOf(nc net.Conn) syscall.RawConn {
	for {
		if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
			nc = u.NetConn()
			continue
		}
		break
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}
