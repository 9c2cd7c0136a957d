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
	defer l.unreserve(s)
	got := map[string]string{}
	// The session's goroutine owns the connection: ask it to pause by
	// sending the query as a request of its own.
	done := make(chan error, 1)
	s.inspect <- func() {
		for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"} {
			var v string
			if err := s.conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
				done <- err
				return
			}
			got[name] = v
		}
		done <- nil
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return got
}
