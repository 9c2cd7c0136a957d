package inflight

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/mailbox"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// runner counts work as an owner's mailbox does, refusing it once
// closed.
type runner struct {
	*mailbox.Mailbox[struct{}]
	wg sync.WaitGroup
}

func newRunner() *runner {
	r := &runner{}
	r.Mailbox = mailbox.New[struct{}](&r.wg)
	return r
}

// close closes the mailbox and waits for the work it counted.
func (r *runner) close() {
	r.Close(func(struct{}) {})
	r.wg.Wait()
}

// A ctx that cannot end runs the statement on the caller's goroutine; one
// that can, on a goroutine of its own. Either way the reply is the caller's.
func TestReplyGoesToCaller(t *testing.T) {
	r := newRunner()
	defer r.close()
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		v, gaveUp, err := Send(ctx, r, time.Minute, time.Minute, func(context.Context) (int, error) {
			return 7, nil
		}, func(context.Context, int, error) { t.Error("abandoned called for a caller that waited") })
		if v != 7 || gaveUp || err != nil {
			t.Fatalf("Send = %d, %v, %v; want 7, false, nil", v, gaveUp, err)
		}
	}
}

func TestGivenUpReplyGoesToAbandoned(t *testing.T) {
	r := newRunner()
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("caller left")
	release := make(chan struct{})
	got := make(chan int, 1)
	sent := make(chan struct{})
	go func() {
		<-sent
		cancel(cause)
	}()
	v, gaveUp, err := Send(ctx, r, time.Minute, time.Minute, func(sctx context.Context) (int, error) {
		close(sent)
		<-release
		if sctx.Err() != nil {
			t.Error("the statement's context ended with the caller's")
		}
		return 7, nil
	}, func(_ context.Context, v int, err error) {
		if err != nil {
			t.Errorf("abandoned got error %v", err)
		}
		got <- v
	})
	close(release)
	if v != 0 || !gaveUp || !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Fatalf("Send = %d, %v, %v; want 0, true, canceled with the cause", v, gaveUp, err)
	}
	if v := <-got; v != 7 {
		t.Fatalf("abandoned got %d, want 7", v)
	}
	r.close()
}

func TestGivenUpWithoutAbandoned(t *testing.T) {
	r := newRunner()
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	_, gaveUp, err := Send(ctx, r, time.Minute, time.Minute, func(context.Context) (int, error) {
		cancel()
		<-release
		return 7, nil
	}, nil)
	close(release)
	if gaveUp || !errors.Is(err, context.Canceled) {
		t.Fatalf("Send = %v, %v; want false, canceled", gaveUp, err)
	}
	r.close() // the statement still ran to its reply
}

func TestClosedRunner(t *testing.T) {
	r := newRunner()
	r.close()
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		_, _, err := Send(ctx, r, time.Minute, time.Minute, func(context.Context) (int, error) {
			t.Error("sent on a closed runner")
			return 0, nil
		}, nil)
		if !errors.Is(err, pgbaton.ErrClosed) {
			t.Fatalf("Send = %v, want ErrClosed", err)
		}
	}
}

func TestEndedBeforeSend(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := Send(ctx, newRunner(), time.Minute, time.Minute, func(context.Context) (int, error) {
		t.Error("sent on an ended context")
		return 0, nil
	}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Send = %v, want canceled", err)
	}
}

// A statement its own bound cut off, while its caller still waits, comes
// back as pgerr.ErrSlow on either path: it may yet commit, so it is
// Ambiguous, not the caller's own deadline.
func TestBoundCutIsSlow(t *testing.T) {
	r := newRunner()
	defer r.close()
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		_, gaveUp, err := Send(ctx, r, time.Millisecond, time.Minute, func(sctx context.Context) (int, error) {
			<-sctx.Done()
			return 0, sctx.Err()
		}, func(context.Context, int, error) { t.Error("abandoned called for a caller that waited") })
		if gaveUp || !errors.Is(err, pgerr.ErrSlow) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send = %v, %v; want ErrSlow wrapping the deadline", gaveUp, err)
		}
		if f, _ := pgerr.Classify(ctx, err); f != pgerr.Ambiguous {
			t.Fatalf("Classify(%v) = %d, want Ambiguous", err, f)
		}
	}
}

func TestCtxErr(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := CtxErr(ctx); err != context.Canceled {
		t.Fatalf("CtxErr = %v, want context.Canceled itself", err)
	}
	ctx, cancelCause := context.WithCancelCause(context.Background())
	cause := errors.New("why")
	cancelCause(cause)
	if err := CtxErr(ctx); !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Fatalf("CtxErr = %v, want canceled and the cause", err)
	}
}

func TestNewRef(t *testing.T) {
	a, b := NewRef(), NewRef()
	if !a.Valid || a.Bytes[6]>>4 != 4 || a.Bytes[8]>>6 != 2 {
		t.Errorf("NewRef = %x, valid %t; want a version 4 UUID", a.Bytes, a.Valid)
	}
	if a == b {
		t.Errorf("two NewRefs are both %x", a.Bytes)
	}
}
