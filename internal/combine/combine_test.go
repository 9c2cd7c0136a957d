package combine

import (
	"slices"
	"testing"
)

func TestQueueSendersAndBatches(t *testing.T) {
	var q Queue[string]

	// A lone call starts a sender, which takes it; its empty Take ends
	// its turn and forgets the key.
	if !q.Add("g", "lone", 1) {
		t.Fatal("a lone call did not start a sender")
	}
	if got := q.Take("g"); !slices.Equal(got, []string{"lone"}) {
		t.Fatalf("Take: %v", got)
	}
	if got := q.Take("g"); got != nil {
		t.Fatalf("Take of an empty queue: %v", got)
	}
	if len(q.pending) != 0 || len(q.sending) != 0 {
		t.Fatalf("key kept after its last sender: %v %v", q.pending, q.sending)
	}

	// Senders calls start a sender each; with that many running, further
	// calls queue until their weight reaches Max.
	for i := range Senders {
		if !q.Add("g", "s", 1) {
			t.Fatalf("call %d did not start a sender", i)
		}
	}
	if q.Add("g", "a", 40) || q.Add("g", "b", 30) {
		t.Fatal("a call started a sender with Senders running and less than Max queued")
	}
	if !q.Add("other", "x", 1) {
		t.Fatal("another key shares the senders of g")
	}
	// 1+1+40+30+28 = Max: another sender starts, beside the others.
	if !q.Add("g", "c", Max-2-40-30) {
		t.Fatal("Max leases queued did not start a sender")
	}
	if got := q.Pending("g"); got != 5 {
		t.Fatalf("Pending: %d, want 5", got)
	}
	if got := len(q.All()); got != 6 {
		t.Fatalf("All: %d calls, want 6", got)
	}

	// Take takes the first and then as many as fit in Max: here all of
	// them, exactly Max.
	if got := q.Take("g"); !slices.Equal(got, []string{"s", "s", "a", "b", "c"}) {
		t.Fatalf("Take: %v", got)
	}
	if q.Add("g", "d", 50) || !q.Add("g", "e", 51) {
		t.Fatal("senders started below Max, or not at Max")
	}
	if got := q.Take("g"); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("Take past Max: %v", got)
	}
	if got := q.Take("g"); !slices.Equal(got, []string{"e"}) {
		t.Fatalf("Take: %v", got)
	}
	q.Add("g", "big", Max+1) // starts a sender: Max queued
	// The first call goes even when it weighs more than Max alone.
	if got := q.Take("g"); !slices.Equal(got, []string{"big"}) {
		t.Fatalf("Take: %v", got)
	}

	// Of the Senders+3 senders of g, only the last one's empty Take
	// forgets g.
	for i := range Senders + 2 {
		if q.Take("g") != nil {
			t.Fatal("Take of an empty queue returned calls")
		}
		if _, ok := q.sending["g"]; !ok {
			t.Fatalf("g forgotten after %d of %d senders ended", i+1, Senders+3)
		}
	}
	if q.Take("g") != nil {
		t.Fatal("Take of an empty queue returned calls")
	}
	if _, ok := q.sending["g"]; ok {
		t.Fatal("g kept after its last sender ended")
	}
	if _, ok := q.pending["g"]; ok {
		t.Fatal("g's queue kept after its last sender ended")
	}
	if got := q.All(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("All: %v", got)
	}
}

// TestQueueIdleKeepsTurnWhileCallsWait: a sender that finds calls queued
// keeps its turn (the caller then spawns a sender to take them).
func TestQueueIdleKeepsTurnWhileCallsWait(t *testing.T) {
	var q Queue[int]
	q.Add("g", 1, 1)
	q.Add("g", 2, 1)
	q.Add("g", 3, 1) // queued: Senders run
	if q.Idle("g") {
		t.Fatal("Idle with a call queued")
	}
	if got := q.Take("g"); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("Take: %v", got)
	}
	if !q.Idle("g") || q.Take("g") != nil {
		t.Fatal("senders did not end once the queue was empty")
	}
	if len(q.sending) != 0 {
		t.Fatalf("key kept: %v", q.sending)
	}
}
