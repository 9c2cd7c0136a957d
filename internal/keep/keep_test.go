package keep

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/pgbaton/pgbaton"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// claims is a claim the test answers: each call sends the room left and
// waits for what to return.
type claims struct {
	room    chan int
	answers chan answer
}

type answer struct {
	got []int
	err error
}

func newClaims() *claims { return &claims{room: make(chan int), answers: make(chan answer)} }

func (c *claims) claim(room func() int, woken <-chan struct{}) func() ([]int, error) {
	return func() ([]int, error) {
		c.room <- room()
		a := <-c.answers
		return a.got, a.err
	}
}

func TestRunKeepsUpToMaxAndClaimsAgainWhenOneEnds(t *testing.T) {
	c := newClaims()
	release := map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{}), 3: make(chan struct{})}
	started := make(chan int, 3)
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("stop")
	done := make(chan error)
	go func() {
		done <- Run(ctx, Config[int]{
			Max:   2,
			Claim: c.claim,
			Work: func(l int) {
				started <- l
				<-release[l]
			},
			Permanent: func(error) bool { return false },
			Logger:    quiet,
		})
	}()
	if room := <-c.room; room != 2 {
		t.Fatalf("first claim for %d; want Max", room)
	}
	c.answers <- answer{got: []int{1}}
	<-started
	if room := <-c.room; room != 1 {
		t.Fatalf("second claim for %d; want 1 (one held)", room)
	}
	c.answers <- answer{got: []int{2}}
	<-started
	// At Max it claims no more until one ends.
	select {
	case room := <-c.room:
		t.Fatalf("claimed for %d at Max", room)
	default:
	}
	close(release[1])
	if room := <-c.room; room != 1 {
		t.Fatalf("claim after an end for %d; want 1", room)
	}
	c.answers <- answer{got: []int{3}}
	<-started
	cancel(stop)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before its Works did", err)
	default:
	}
	close(release[2])
	close(release[3])
	if err := <-done; err != stop {
		t.Fatalf("Run = %v; want ctx's cause", err)
	}
}

func TestRunRetriesThenReturnsWhatRetryingCannotFix(t *testing.T) {
	c := newClaims()
	permanent := errors.New("permanent")
	pauses := 0
	done := make(chan error)
	go func() {
		done <- Run(context.Background(), Config[int]{
			Max:       1,
			Claim:     c.claim,
			Work:      func(int) {},
			Permanent: func(err error) bool { return err == permanent },
			Pause:     func(<-chan struct{}) error { pauses++; return nil },
			Logger:    quiet,
		})
	}()
	<-c.room
	c.answers <- answer{err: errors.New("transient")}
	<-c.room
	c.answers <- answer{err: permanent}
	if err := <-done; err != permanent || pauses != 1 {
		t.Fatalf("Run = %v after %d pauses; want the permanent error after 1", err, pauses)
	}

	paused := errors.New("client closed while pausing")
	go func() {
		done <- Run(context.Background(), Config[int]{
			Max: 1, Claim: c.claim, Work: func(int) {}, Logger: quiet,
			Permanent: func(error) bool { return false },
			Pause:     func(<-chan struct{}) error { return paused },
		})
	}()
	<-c.room
	c.answers <- answer{err: errors.New("transient")}
	if err := <-done; err != paused {
		t.Fatalf("Run = %v; want Pause's error", err)
	}
}

func TestRunAtMaxEndsWhenTheClientCloses(t *testing.T) {
	closed := make(chan struct{})
	claimed := make(chan struct{})
	claims := 0
	done := make(chan error)
	go func() {
		done <- Run(context.Background(), Config[int]{
			Max: 1,
			Claim: func(func() int, <-chan struct{}) func() ([]int, error) {
				return func() ([]int, error) {
					if claims++; claims == 1 {
						close(claimed)
						return []int{1}, nil
					}
					// The Work may end before Run sees the client closed:
					// a claim then fails as a closed client's does.
					return nil, pgbaton.ErrClosed
				}
			},
			Work:      func(int) { <-closed }, // the lease ends with the client
			Closed:    closed,
			Permanent: func(err error) bool { return errors.Is(err, pgbaton.ErrClosed) },
			Logger:    quiet,
		})
	}()
	<-claimed
	close(closed)
	if err := <-done; !errors.Is(err, pgbaton.ErrClosed) {
		t.Fatalf("Run = %v; want ErrClosed", err)
	}
}
