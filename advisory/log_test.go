package advisory_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

func (r *logRecorder) logger() *slog.Logger { return slog.New(r) }

// find returns the attributes of the first record at level whose message
// contains msg.
func (r *logRecorder) find(level slog.Level, msg string) (map[string]slog.Value, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if rec.Level == level && strings.Contains(rec.Message, msg) {
			attrs := map[string]slog.Value{}
			rec.Attrs(func(a slog.Attr) bool {
				attrs[a.Key] = a.Value
				return true
			})
			return attrs, true
		}
	}
	return nil, false
}

// requireLogged fails unless a record at level containing msg was logged.
func (r *logRecorder) requireLogged(t *testing.T, level slog.Level, msg string) map[string]slog.Value {
	t.Helper()
	attrs, ok := r.find(level, msg)
	if !ok {
		r.mu.Lock()
		var got []string
		for _, rec := range r.records {
			got = append(got, rec.Level.String()+" "+rec.Message)
		}
		r.mu.Unlock()
		t.Fatalf("no %s record containing %q; got %q", level, msg, got)
	}
	return attrs
}

func (r *logRecorder) levels() []slog.Level {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Level
	for _, rec := range r.records {
		out = append(out, rec.Level)
	}
	return out
}

func TestLogsLossAndReopen(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	admin := adminPool(t)
	rec := &logRecorder{}
	l := newLocker(t, d.Pool(t), advisory.Config{Logger: rec.logger(), PingInterval: 50 * time.Millisecond, PingTimeout: time.Second})

	lk, err := l.TryLock(ctx, advisory.Int64(8001))
	require.NoError(t, err)
	_, err = l.TryLock(ctx, advisory.Int64(8002))
	require.NoError(t, err)
	opened := rec.requireLogged(t, slog.LevelDebug, "session opened")
	pid := holderPID(t, admin, d, 8001)
	require.EqualValues(t, pid, opened["pid"].Int64())
	require.NotContains(t, rec.levels(), slog.LevelWarn, "nothing wrong yet")

	env.Terminate(t, pid)
	<-lk.Done()
	// Logged just after the locks are cancelled.
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		_, ok := rec.find(slog.LevelWarn, "session lost")
		return ok, nil
	}, "the loss is logged")
	lost := rec.requireLogged(t, slog.LevelWarn, "session lost")
	require.EqualValues(t, pid, lost["pid"].Int64())
	require.EqualValues(t, 2, lost["locks"].Int64())
	require.Contains(t, lost["error"].String(), "lock lost")

	lk, err = l.TryLock(ctx, advisory.Int64(8001))
	require.NoError(t, err)
	rec.requireLogged(t, slog.LevelInfo, "opened again after a lost session")
	require.NoError(t, lk.Unlock(ctx))
	require.NoError(t, l.Close(ctx))
	rec.requireLogged(t, slog.LevelDebug, "session closed")
}

func TestLogsLockTableFull(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	d := env.DB(t)
	rec := &logRecorder{}
	l := newLocker(t, d.Pool(t), advisory.Config{Logger: rec.logger(), MaxLocks: 1})
	lk, err := l.TryLock(ctx, advisory.Int64(1))
	require.NoError(t, err)
	_, err = l.TryLock(ctx, advisory.Int64(2))
	require.ErrorIs(t, err, advisory.ErrLockTableFull)
	attrs := rec.requireLogged(t, slog.LevelWarn, "lock table full")
	require.Equal(t, "lock key:2", attrs["op"].String())
	// Plain contention is the caller's business, not a log line.
	other := newLocker(t, d.Pool(t), advisory.Config{Logger: rec.logger()})
	_, err = other.TryLock(ctx, advisory.Int64(1))
	require.ErrorIs(t, err, advisory.ErrLocked)
	warnings := slices.DeleteFunc(rec.levels(), func(l slog.Level) bool { return l != slog.LevelWarn })
	require.Len(t, warnings, 1, "one warning only")
	require.NoError(t, lk.Unlock(ctx))
}
