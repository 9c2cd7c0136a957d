package mailbox

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

type owner struct {
	n       int
	stopped bool
}

// run is an owner's loop: it runs messages in order until its last one.
func run(b *Mailbox[*owner], o *owner, work *sync.WaitGroup) {
	defer work.Done()
	for !o.stopped {
		<-b.Signal()
		for _, m := range b.Take() {
			m(o)
		}
	}
}

// start returns a mailbox whose owner o runs, and the work Close waits for.
func start() (*Mailbox[*owner], *owner, *sync.WaitGroup) {
	work := new(sync.WaitGroup)
	b := New[*owner](work)
	o := &owner{}
	work.Add(1)
	go run(b, o, work)
	return b, o, work
}

func TestMessagesRunOnTheOwnerInOrderUntilClose(t *testing.T) {
	b, o, work := start()

	var seen []int
	for i := range 100 {
		require.True(t, b.Post(func(o *owner) { o.n++; seen = append(seen, i) }))
	}
	var n int
	require.True(t, b.Ask(func(o *owner) { n = o.n }))
	require.Equal(t, 100, n)
	for i, v := range seen {
		require.Equal(t, i, v)
	}

	ran := make(chan struct{})
	require.True(t, b.Spawn(func() { close(ran) }))
	<-ran
	require.True(t, b.Enter())
	require.False(t, b.Locked(func() { t.Error("Locked ran before Close") }))

	require.True(t, b.Close(func(o *owner) { o.stopped = true }))
	require.False(t, b.Close(func(*owner) {}), "a second Close")
	require.True(t, b.Closed())
	require.False(t, b.Post(func(*owner) { t.Error("ran after Close") }))
	require.False(t, b.Ask(func(*owner) { t.Error("ran after Close") }))
	require.False(t, b.Enter())
	require.False(t, b.Spawn(func() { t.Error("spawned after Close") }))
	locked := false
	require.True(t, b.Locked(func() { locked = true }))
	require.True(t, locked)

	b.Exit() // the work entered above
	work.Wait()
	require.True(t, o.stopped)
}

func TestPlainRunsOnTheOwner(t *testing.T) {
	b, _, work := start()
	p := b.Plain()
	ran := 0
	require.True(t, p.Post(func() { ran++ }))
	require.True(t, p.Ask(func() { ran++ }))
	require.Equal(t, 2, ran)
	require.True(t, b.Close(func(o *owner) { o.stopped = true }))
	require.False(t, p.Post(func() { t.Error("ran after Close") }))
	require.False(t, p.Spawn(func() { t.Error("spawned after Close") }))
	work.Wait()
}
