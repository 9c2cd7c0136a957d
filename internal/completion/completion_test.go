package completion

import (
	"slices"
	"testing"
)

type lease struct {
	name  string
	token int64
}

func (l *lease) Name() string { return l.name }
func (l *lease) Token() int64 { return l.token }

func TestSettleTellsEachLeaseAndListsTheNotCompleted(t *testing.T) {
	a, b, c := &lease{"a", 1}, &lease{"b", 2}, &lease{"c", 3}
	batch := Batch[*lease]{Sent: []*lease{a, b, c}, Unheld: []string{"released-before"}}
	told := map[string]bool{}
	var order []string
	// The database deleted a and c, in another order, and a row not sent.
	missing := batch.Settle([]string{"c", "other", "a"}, func(l *lease, gone bool) {
		told[l.name] = gone
		order = append(order, l.name)
	})
	if !slices.Equal(order, []string{"a", "b", "c"}) {
		t.Fatalf("leases told out of order: %v", order)
	}
	if !told["a"] || told["b"] || !told["c"] {
		t.Fatalf("told %v, want a and c gone, b not", told)
	}
	// Those not sent come first, then those sent but not deleted.
	if !slices.Equal(missing, []string{"released-before", "b"}) {
		t.Fatalf("missing %v", missing)
	}
}

func TestSettleAllCompleted(t *testing.T) {
	a := &lease{"a", 1}
	batch := Batch[*lease]{Sent: []*lease{a}}
	if missing := batch.Settle([]string{"a"}, func(*lease, bool) {}); len(missing) != 0 {
		t.Fatalf("missing %v", missing)
	}
	// Nothing sent and nothing unheld: nothing is missing, nobody told.
	empty := Batch[*lease]{}
	if missing := empty.Settle(nil, func(*lease, bool) { t.Fatal("told a lease not sent") }); len(missing) != 0 {
		t.Fatalf("missing %v", missing)
	}
}

func TestMatchAppendsToMissing(t *testing.T) {
	a, b := &lease{"a", 1}, &lease{"b", 2}
	// CompleteTx: the names still held; those that are not were taken
	// over, and join the names found unheld before.
	lost := map[string]bool{}
	missing := Match([]*lease{a, b}, []string{"b"}, []string{"x"}, func(l *lease, held bool) {
		if !held {
			lost[l.name] = true
		}
	})
	if !slices.Equal(missing, []string{"x", "a"}) || !lost["a"] || lost["b"] {
		t.Fatalf("missing %v, lost %v", missing, lost)
	}
}

func TestGrantsAppendsInOrder(t *testing.T) {
	names, tokens := Grants(nil, nil, []*lease{{"a", 1}, {"b", 2}})
	// A second call's grants follow the first's in one statement.
	names, tokens = Grants(names, tokens, []*lease{{"c", 3}})
	if !slices.Equal(names, []string{"a", "b", "c"}) || !slices.Equal(tokens, []int64{1, 2, 3}) {
		t.Fatalf("names %v tokens %v", names, tokens)
	}
	if names, tokens := Grants(nil, nil, []*lease(nil)); names != nil || tokens != nil {
		t.Fatalf("grants of no leases: %v %v", names, tokens)
	}
}

func TestProblem(t *testing.T) {
	a, b, other := &lease{"a", 1}, &lease{"b", 2}, &lease{"x", 9}
	own := func(l *lease) bool { return l != nil && l != other }
	for _, c := range []struct {
		leases []*lease
		once   bool
		want   string
	}{
		{[]*lease{a, b}, true, ""},
		{[]*lease{a, nil}, false, "Complete needs leases of this client"},
		{[]*lease{a, other}, true, "Complete needs leases of this client"},
		{[]*lease{a, b, a}, true, `Complete got lease "a" twice`},
		{[]*lease{a, b, a}, false, ""},
	} {
		if got := Problem("Complete", c.leases, own, c.once); got != c.want {
			t.Errorf("Problem(%v, once %t) = %q, want %q", c.leases, c.once, got, c.want)
		}
	}
}

// Every lease is named; only those stopped carry their token, the others
// 0, which matches no row.
func TestHand(t *testing.T) {
	a, b, c := &lease{"a", 1}, &lease{"b", 2}, &lease{"c", 3}
	names, tokens, handed, unheld := Hand([]*lease{a, b, c}, func(l *lease) bool { return l != b })
	if !slices.Equal(names, []string{"a", "b", "c"}) || !slices.Equal(tokens, []int64{1, 0, 3}) ||
		!slices.Equal(handed, []*lease{a, c}) || !slices.Equal(unheld, []string{"b"}) {
		t.Fatalf("Hand = %v %v %v %v", names, tokens, handed, unheld)
	}
}
