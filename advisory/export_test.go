package advisory

import (
	"context"
	"testing"
)

// SessionSettingsForTest reads the TCP settings from the Locker's first
// session.
func SessionSettingsForTest(t testing.TB, l *Locker) map[string]string {
	t.Helper()
	s, err := l.reserveSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.pending.Add(-1) // no request goes through the queue
	defer l.unreserve(s)
	got := map[string]string{}

	s.withConn(func(oc *ownedConn) {
		conn := oc.conn
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
