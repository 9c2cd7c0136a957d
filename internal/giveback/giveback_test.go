package giveback

import (
	"slices"
	"testing"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
)

func sorted[T int | string](s []T) []T { slices.Sort(s); return s }

func TestQueueSendsTogetherAndKeepsFailures(t *testing.T) {
	var q Queue[int, string]
	if _, _, ok := q.Send(); ok || q.RefsPending() {
		t.Fatal("an empty queue sends")
	}

	// Everything queued goes in one give-back; while it is on its way
	// nothing else is sent, and its refs keep the session in use.
	q.Add(1, 2)
	q.AddRef("a")
	leases, refs, ok := q.Send()
	if !ok || !slices.Equal(sorted(leases), []int{1, 2}) || !slices.Equal(refs, []string{"a"}) {
		t.Fatalf("Send: %v %v %v", leases, refs, ok)
	}
	q.AddRef("b")
	if _, _, ok := q.Send(); ok {
		t.Fatal("a second give-back while one is on its way")
	}

	// The leases failed, ref a went: the leases stay queued and nothing
	// is sent again at once (the next keep-alive does).
	if q.Sent(leases, false, refs, []string{"a"}) {
		t.Fatal("sent again after a failure")
	}
	if !q.RefsPending() {
		t.Fatal("ref b queued meanwhile is not pending")
	}
	leases, refs, ok = q.Send()
	if !ok || !slices.Equal(sorted(leases), []int{1, 2}) || !slices.Equal(refs, []string{"b"}) {
		t.Fatalf("Send after a failure: %v %v %v", leases, refs, ok)
	}

	// A ref failed: the leases that went are dropped, but nothing is
	// sent again at once.
	q.Add(3)
	if q.Sent(leases, true, refs, nil) {
		t.Fatal("sent again after a ref failed")
	}
	if l, r := q.All(); !slices.Equal(l, []int{3}) || !slices.Equal(r, []string{"b"}) {
		t.Fatalf("left: %v %v", l, r)
	}

	// A fully successful give-back sends what was queued meanwhile.
	leases, refs, _ = q.Send()
	q.Add(4)
	if !q.Sent(leases, true, refs, refs) {
		t.Fatal("what was queued meanwhile is not sent at once")
	}
	if l, r := q.All(); !slices.Equal(l, []int{4}) || len(r) != 0 || q.RefsPending() {
		t.Fatalf("left: %v %v", l, r)
	}

	// A give-back that could not start leaves the queue as it was, free
	// to send.
	if _, _, ok := q.Send(); !ok {
		t.Fatal("4 not sent")
	}
	q.Unsent()
	if l, _, ok := q.Send(); !ok || !slices.Equal(l, []int{4}) {
		t.Fatalf("Send after Unsent: %v %v", l, ok)
	}
}

func TestScheduleBacksOffUntilSomethingSettles(t *testing.T) {
	const most = 60 * time.Millisecond
	var s Schedule[string]
	t0 := time.Unix(1000, 0)
	if _, ok := s.Next(); ok {
		t.Fatal("an empty schedule asks")
	}
	s.Add(t0, "a", "b")
	if at, ok := s.Next(); !ok || !at.Equal(t0.Add(SettleFirst)) {
		t.Fatalf("first ask at %v %v", at, ok)
	}
	// Added to a schedule that is not empty: the time does not move.
	s.Add(t0.Add(5*time.Millisecond), "c")
	if at, _ := s.Next(); !at.Equal(t0.Add(SettleFirst)) {
		t.Fatalf("Add moved the ask to %v", at)
	}

	ended := map[string]bool{}
	isEnded := func(l string) bool { return ended[l] }
	now := t0
	ask := func(settled bool) time.Duration {
		t.Helper()
		asked := s.Ask()
		if _, ok := s.Next(); ok {
			t.Fatal("asks again while an ask is on its way")
		}
		now = now.Add(time.Millisecond)
		s.Answered(now, asked, isEnded, settled, most)
		at, ok := s.Next()
		if !ok {
			return -1
		}
		return at.Sub(now)
	}
	// Nothing settles: 20, 40, then 60 (the bound), 60.
	for _, want := range []time.Duration{20, 40, 60, 60} {
		if got := ask(false); got != want*time.Millisecond {
			t.Fatalf("interval %v, want %v", got, want*time.Millisecond)
		}
	}
	// a settles: dropped, and the interval starts over.
	ended["a"] = true
	if got := ask(true); got != SettleFirst {
		t.Fatalf("interval after a settled: %v", got)
	}
	if got := sorted(s.Ask()); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("pending: %v", got)
	}
	s.Unasked()
	if _, ok := s.Next(); !ok {
		t.Fatal("an ask that could not start blocks the next")
	}
	ended["b"], ended["c"] = true, true
	if got := ask(true); got != -1 {
		t.Fatalf("asks with nothing pending, in %v", got)
	}
	// Emptied, it starts again at SettleFirst.
	s.Add(now, "d")
	if at, _ := s.Next(); !at.Equal(now.Add(SettleFirst)) {
		t.Fatalf("ask after emptied at %v", at)
	}
}

type named string

func (n named) Name() string { return string(n) }

// A committed completion's row is gone, a rolled-back one's released; the
// others' transactions are still open.
func TestSettledReadsTheStates(t *testing.T) {
	rows := []db.LeaseSettleManyRow{{Name: "c", State: "released"}, {Name: "a", State: "gone"}, {Name: "b", State: "open"}}
	var told []string
	settled := Settled([]named{"a", "b", "c", "d"}, rows, func(l named, committed bool) {
		if committed {
			told = append(told, string(l)+" committed")
		} else {
			told = append(told, string(l)+" rolled back")
		}
	})
	if !settled || !slices.Equal(told, []string{"a committed", "c rolled back"}) {
		t.Fatalf("settled %t, told %v", settled, told)
	}
	if Settled([]named{"b"}, rows, func(named, bool) { t.Fatal("told of an open transaction") }) {
		t.Fatal("settled with every transaction open")
	}
}
