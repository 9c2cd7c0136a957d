// Package mailbox is how others talk to a goroutine that owns state they
// share, as River's elector and etcd's Session own theirs: they post it
// messages (functions it runs on its goroutine) instead of taking a lock
// on the state. The mailbox also counts the work its owner's Close waits
// for (Enter, Spawn), so that once closing has begun nothing new starts.
//
// Its one mutex is a leaf (nothing is called or locked under it): it
// guards the inbox and whether the mailbox closed, and Enter counts work
// under it, as a sync.WaitGroup must not grow while it is waited for.
package mailbox

import "sync"

// Mailbox is the inbox of an owner of type T. Its methods are safe for
// concurrent use.
type Mailbox[T any] struct {
	mu     sync.Mutex
	closed bool
	inbox  []func(T)
	signal chan struct{} // one slot: the inbox has messages
	work   *sync.WaitGroup
}

// New returns an open mailbox whose Enter and Spawn count on work, the
// group the owner's Close waits for.
func New[T any](work *sync.WaitGroup) *Mailbox[T] {
	return &Mailbox[T]{signal: make(chan struct{}, 1), work: work}
}

// Post queues m for the owner, and reports whether the owner will run it:
// not once the mailbox closed.
func (b *Mailbox[T]) Post(m func(T)) bool { return b.send(m, false) }

// Close queues m as the owner's last message and closes the mailbox; it
// reports false when the mailbox had closed already.
func (b *Mailbox[T]) Close(m func(T)) bool { return b.send(m, true) }

func (b *Mailbox[T]) send(m func(T), last bool) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.inbox = append(b.inbox, m)
	b.closed = last
	b.mu.Unlock()
	select {
	case b.signal <- struct{}{}:
	default:
	}
	return true
}

// Ask runs f on the owner's goroutine and waits for it; false when the
// mailbox closed.
func (b *Mailbox[T]) Ask(f func(T)) bool {
	done := make(chan struct{})
	if !b.Post(func(t T) { f(t); close(done) }) {
		return false
	}
	<-done
	return true
}

// Signal receives when messages wait: the owner then Takes them.
func (b *Mailbox[T]) Signal() <-chan struct{} { return b.signal }

// Take returns the messages waiting, in the order they were posted.
func (b *Mailbox[T]) Take() []func(T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	inbox := b.inbox
	b.inbox = nil
	return inbox
}

// Closed reports whether the mailbox closed.
func (b *Mailbox[T]) Closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Enter counts work the owner's Close waits for, and reports whether it
// did: not once the mailbox closed. The caller calls Exit when the work is
// over.
func (b *Mailbox[T]) Enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.work.Add(1)
	return true
}

// Exit ends work counted by Enter.
func (b *Mailbox[T]) Exit() { b.work.Done() }

// Spawn runs fn on a goroutine the owner's Close waits for, and reports
// whether it did: not once the mailbox closed.
func (b *Mailbox[T]) Spawn(fn func()) bool {
	if !b.Enter() {
		return false
	}
	go func() {
		defer b.work.Done()
		fn()
	}()
	return true
}

// Locked runs f under the mailbox's lock when it has closed, and reports
// whether it did: for what must reach the owner's Close once the owner no
// longer reads its mailbox (Close reads it under the same lock).
func (b *Mailbox[T]) Locked(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		return false
	}
	f()
	return true
}

// Plain is the mailbox for users whose messages do not take the owner's
// state (listener.Owner): Post, Ask and Spawn of func().
func (b *Mailbox[T]) Plain() Plain[T] { return Plain[T]{b} }

// Plain is a Mailbox whose messages are plain functions.
type Plain[T any] struct{ b *Mailbox[T] }

func (p Plain[T]) Post(f func()) bool  { return p.b.Post(func(T) { f() }) }
func (p Plain[T]) Ask(f func()) bool   { return p.b.Ask(func(T) { f() }) }
func (p Plain[T]) Spawn(f func()) bool { return p.b.Spawn(f) }
