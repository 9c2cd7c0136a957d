package election

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// stepWaiter is a waiter whose every Wait returns at the test's word: nil
// to look again, an error to stop. It records the longest wait asked.
type stepWaiter struct {
	steps chan error
	waits chan time.Duration
}

func newStepWaiter() *stepWaiter {
	return &stepWaiter{steps: make(chan error), waits: make(chan time.Duration, 100)}
}

func (w *stepWaiter) Wait(ctx context.Context, d time.Duration, _ <-chan struct{}) error {
	w.waits <- d
	select {
	case err := <-w.steps:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type reading struct {
	term      int64
	remaining time.Duration
	ok        bool
	err       error
}

func TestFollowSendsEachNewerTermOnce(t *testing.T) {
	reads := []reading{
		{ok: false}, // nobody leads: nothing sent
		{term: 3, remaining: time.Second, ok: true}, // sent
		{term: 3, remaining: time.Second, ok: true}, // the same term: not again
		{err: errors.New("down")},                   // an outage: looked at again with backoff
		{term: 2, remaining: time.Second, ok: true}, // older: never after a newer one
		{term: 5, remaining: time.Hour, ok: true},   // sent
	}
	w := newStepWaiter()
	ch := make(chan int64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		i := 0
		Follow(ctx, w, ch, Follower[int64]{
			Read: func(context.Context) (int64, int64, time.Duration, bool, error) {
				r := reads[i]
				i++
				return r.term, r.term, r.remaining, r.ok, r.err
			},
			TTL: time.Minute, Logger: quiet,
		})
	}()
	var sent []int64
	var waits []time.Duration
	for range reads {
		select {
		case term := <-ch:
			sent = append(sent, term)
			waits = append(waits, <-w.waits)
		case d := <-w.waits:
			waits = append(waits, d)
		}
		if len(waits) < len(reads) {
			w.steps <- nil
		}
	}
	w.steps <- io.EOF // the waiter ends: Follow returns
	<-done
	if len(sent) != 2 || sent[0] != 3 || sent[1] != 5 {
		t.Fatalf("sent %v; want [3 5]", sent)
	}
	// Nobody leading waits TTL; a leader, its remaining time at most; an
	// outage, the backoff's first delay (less than TTL).
	if waits[0] != time.Minute || waits[1] != time.Second || waits[3] >= time.Minute || waits[5] != time.Minute {
		t.Fatalf("waits %v", waits)
	}
}

func TestFollowStopsWhenNobodyReads(t *testing.T) {
	read := func(context.Context) (int64, int64, time.Duration, bool, error) { return 1, 1, time.Second, true, nil }
	closed := make(chan struct{})
	close(closed)
	Follow(context.Background(), newStepWaiter(), make(chan int64), Follower[int64]{Read: read, TTL: time.Minute, Closed: closed, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Follow(ctx, newStepWaiter(), make(chan int64), Follower[int64]{Read: read, TTL: time.Minute, Logger: quiet})
}

func TestWatchAsksOnceARequestIsRead(t *testing.T) {
	term, end := context.WithCancel(context.Background())
	defer end()
	a := NewAsked(term)
	if a.Reason() != nil {
		t.Fatal("Reason before any request")
	}
	w := newStepWaiter()
	request := errors.New("asked by op: upgrade")
	joins, leaves, looks := 0, 0, 0
	paused := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(term, a, ResignWatch[*stepWaiter]{
			Join: func(context.Context) (*stepWaiter, error) {
				if joins++; joins == 1 {
					return nil, errors.New("no session") // tried again after Pause
				}
				return w, nil
			},
			Leave: func(got *stepWaiter) {
				if got != w {
					t.Error("Leave of another waiter")
				}
				leaves++
			},
			Look: func(context.Context) (error, error) {
				switch looks++; looks {
				case 1:
					return nil, nil // none yet
				case 2:
					return nil, errors.New("read failed") // logged, waited
				}
				return request, nil
			},
			Pause:  func(context.Context) error { close(paused); return nil },
			TTL:    time.Minute,
			Logger: quiet,
		})
	}()
	<-paused
	for range 2 {
		if d := <-w.waits; d != time.Minute {
			t.Errorf("waited %s; want TTL", d)
		}
		select {
		case <-a.Requested():
			t.Fatal("requested before the request was read")
		default:
		}
		w.steps <- nil
	}
	<-done
	<-a.Requested()
	if !errors.Is(a.Reason(), request) || !errors.Is(context.Cause(a.Context()), request) {
		t.Fatalf("Reason %v, cause %v; want the request", a.Reason(), context.Cause(a.Context()))
	}
	if term.Err() != nil {
		t.Fatal("a request ended the term itself")
	}
	if joins != 2 || leaves != 1 || looks != 3 {
		t.Fatalf("joins %d, leaves %d, looks %d", joins, leaves, looks)
	}
}

func TestWatchEndsWithTheTerm(t *testing.T) {
	term, end := context.WithCancel(context.Background())
	a := NewAsked(term)
	w := newStepWaiter()
	left := make(chan struct{})
	go Watch(term, a, ResignWatch[*stepWaiter]{
		Join:   func(context.Context) (*stepWaiter, error) { return w, nil },
		Leave:  func(*stepWaiter) { close(left) },
		Look:   func(context.Context) (error, error) { return nil, nil },
		TTL:    time.Minute,
		Logger: quiet,
	})
	<-w.waits
	end()
	<-left
	<-a.Context().Done()
	if a.Reason() != nil {
		t.Fatalf("Reason %v after the term ended without a request", a.Reason())
	}
}
