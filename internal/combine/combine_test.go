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

// owner is a Sender's owner run on the test's goroutine: Ask runs f at
// once, Spawn keeps f to run when the test says.
type owner struct {
	q       Queue[string]
	asks    int // Asks: round trips the caller waits for
	stopped bool
	spawned []func()
	sent    [][]string
}

// run runs f at once, unless the owner stopped: an Ask or a Post.
func (o *owner) run(f func(*owner)) bool {
	if o.stopped {
		return false
	}
	f(o)
	return true
}

func (o *owner) sender() *Sender[*owner, string] {
	return &Sender[*owner, string]{
		Ask: func(f func(*owner)) bool {
			o.asks++
			return o.run(f)
		},
		Post:  o.run,
		Spawn: func(f func()) bool { o.spawned = append(o.spawned, f); return true },
		Queue: func(o *owner) *Queue[string] { return &o.q },
		Send:  func(key string, calls []string) { o.sent = append(o.sent, calls) },
	}
}

// TestSenderLoneCallSendsAtOnce: a call that finds a sender free is sent
// by its caller, alone, after one Ask of the owner (its turn ends by a
// Post), and the key is forgotten after.
func TestSenderLoneCallSendsAtOnce(t *testing.T) {
	o := &owner{}
	if !o.sender().Join("g", "a", 1) {
		t.Fatal("Join refused while the owner runs")
	}
	if len(o.sent) != 1 || !slices.Equal(o.sent[0], []string{"a"}) || len(o.spawned) != 0 {
		t.Fatalf("sent %v, spawned %d", o.sent, len(o.spawned))
	}
	if o.asks != 1 {
		t.Errorf("a lone call asked the owner %d times, want 1", o.asks)
	}
	if len(o.q.pending) != 0 || len(o.q.sending) != 0 {
		t.Fatalf("key kept: %v %v", o.q.pending, o.q.sending)
	}
}

// TestSenderQueuesBehindBusySenders: with Senders round trips in flight a
// call waits; once Max leases wait, a caller sends a round trip beside
// them and leaves what is left to a spawned sender.
func TestSenderQueuesBehindBusySenders(t *testing.T) {
	o := &owner{}
	s := o.sender()
	for range Senders {
		o.q.Add("g", "busy", 1)
	}
	o.q.Take("g") // the busy senders' round trips are in flight

	if !s.Join("g", "x", 1) || len(o.sent) != 0 {
		t.Fatalf("a call behind busy senders was sent: %v", o.sent)
	}
	// x and y weigh more than Max together: y's caller sends x, and
	// spawns a sender for y.
	if !s.Join("g", "y", Max) {
		t.Fatal("Join refused")
	}
	if len(o.sent) != 1 || !slices.Equal(o.sent[0], []string{"x"}) || len(o.spawned) != 1 {
		t.Fatalf("sent %v, spawned %d", o.sent, len(o.spawned))
	}
	o.spawned[0]()
	if len(o.sent) != 2 || !slices.Equal(o.sent[1], []string{"y"}) {
		t.Fatalf("the spawned sender sent %v", o.sent)
	}
	// The busy senders end their turns: the key is forgotten.
	for range Senders {
		if !o.q.Idle("g") {
			t.Fatal("calls left queued")
		}
	}
	if len(o.q.sending) != 0 {
		t.Fatalf("key kept: %v", o.q.sending)
	}
}

// TestSenderOwnerStopped: a call after the owner stopped is neither
// queued nor sent.
func TestSenderOwnerStopped(t *testing.T) {
	o := &owner{stopped: true}
	if o.sender().Join("g", "a", 1) {
		t.Fatal("Join accepted a call after the owner stopped")
	}
	if len(o.sent) != 0 || o.q.Pending("g") != 0 {
		t.Fatalf("sent %v, queued %d", o.sent, o.q.Pending("g"))
	}
}

// TestShareCutsInOrder: each call gets up to its count, in the order the
// calls were taken, and cannot append into the next call's share.
func TestShareCutsInOrder(t *testing.T) {
	rows := []int{1, 2, 3, 4, 5}
	a, rest := Share(rows, 2)
	b, rest := Share(rest, 4)
	c, rest := Share(rest, 1)
	if !slices.Equal(a, []int{1, 2}) || !slices.Equal(b, []int{3, 4, 5}) || len(c) != 0 || len(rest) != 0 {
		t.Fatalf("shares %v %v %v, rest %v", a, b, c, rest)
	}
	_ = append(a, 99)
	if b[0] != 3 {
		t.Fatal("appending to a share wrote over the next")
	}
}
