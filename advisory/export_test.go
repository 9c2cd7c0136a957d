package advisory

import (
	"context"
	"io"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// SessionSettingsForTest reads the TCP settings from the Locker's first
// session.
func SessionSettingsForTest(t testing.TB, l *Locker) map[string]string {
	t.Helper()
	s := firstSession(t, l)
	defer l.unreserve(s)
	got := map[string]string{}
	var err error
	s.WithConn(func(conn *pgx.Conn) {
		for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"} {
			var v string
			if err = conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
				return
			}
			got[name] = v
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// FastPathForTest reports whether the Locker's first session calls the
// lock functions by the fast-path protocol.
func FastPathForTest(t testing.TB, l *Locker) bool {
	t.Helper()
	s := firstSession(t, l)
	defer l.unreserve(s)
	return s.Fast()
}

// firstSession reserves the Locker's first session (opening it if need
// be); the caller must unreserve it.
func firstSession(t testing.TB, l *Locker) *session {
	t.Helper()
	s, err := l.reserveSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Unclaim() // no request goes through the queue
	return s
}

// TraceSparesForTest writes what the server sends to each of the
// Locker's idle spare sessions to w (pgproto3's trace), and returns how
// many spares there are.
func TraceSparesForTest(l *Locker, w io.Writer) int {
	l.mu.Lock()
	spares := slices.Clone(l.spares)
	l.mu.Unlock()
	for _, s := range spares {
		s.WithConn(func(conn *pgx.Conn) {
			conn.PgConn().Frontend().Trace(w, pgproto3.TracerOptions{SuppressTimestamps: true})
		})
	}
	return len(spares)
}
