package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Config configures a Locker. The zero value is usable.
type Config struct {
	// Prefix goes before gocron's job name to form the lease name, so that
	// job leases do not collide with other leases. Default "gocron:".
	Prefix string
	// MinHold is the shortest time a run keeps its job's lease, even when
	// the job returns sooner, so that a scheduler whose ticker fires a
	// little late finds the job still locked. It must be shorter than the
	// job's interval. Default 1s.
	MinHold time.Duration
}

// Locker is a gocron.Locker on pgbaton leases. Close it when the schedulers
// using it have stopped.
type Locker struct {
	client *leasetable.Client
	cfg    Config

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	held    sync.WaitGroup // releases waiting for MinHold to pass
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker taking leases through client.
func NewLocker(client *leasetable.Client, cfg Config) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil leasetable client", pgbaton.ErrInvalidArgument)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "gocron:"
	}
	switch {
	case cfg.MinHold == 0:
		cfg.MinHold = time.Second
	case cfg.MinHold < 0:
		return nil, fmt.Errorf("%w: MinHold %s is negative", pgbaton.ErrInvalidArgument, cfg.MinHold)
	}
	return &Locker{client: client, cfg: cfg, closing: make(chan struct{})}, nil
}

// Lock takes the lease of job key for one run. It fails, and gocron skips
// the run on this scheduler, when another scheduler holds it (an error
// wrapping leasetable.ErrHeld) or the Locker is closed.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil, pgbaton.ErrClosed
	}
	start := time.Now()
	lease, err := l.client.TryAcquire(ctx, l.cfg.Prefix+key)
	if err != nil {
		return nil, err
	}
	return &jobLock{locker: l, lease: lease, notBefore: start.Add(l.cfg.MinHold)}, nil
}

// Close releases at once the leases still kept for MinHold. Runs locked
// after Close fail with pgbaton.ErrClosed.
func (l *Locker) Close(ctx context.Context) error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.closing)
	}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.held.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

type jobLock struct {
	locker    *Locker
	lease     *leasetable.Lease
	notBefore time.Time
	once      sync.Once
}

// Unlock releases the run's lease, or, when the run took less than
// MinHold, keeps it (renewed) until MinHold has passed and releases it then.
func (j *jobLock) Unlock(ctx context.Context) error {
	var err error
	j.once.Do(func() {
		wait := time.Until(j.notBefore)
		if wait <= 0 {
			err = j.release(ctx)
			return
		}
		j.locker.mu.Lock()
		closed := j.locker.closed
		if !closed {
			j.locker.held.Add(1)
		}
		j.locker.mu.Unlock()
		if closed {
			err = j.release(ctx)
			return
		}
		go func() {
			defer j.locker.held.Done()
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-t.C:
			case <-j.locker.closing:
			case <-j.lease.Done():
			}
			_ = j.release(context.WithoutCancel(ctx))
		}()
	})
	return err
}

func (j *jobLock) release(ctx context.Context) error {
	err := j.lease.Release(ctx)
	if errors.Is(err, leasetable.ErrLeaseLost) {
		// Lost while kept: someone else may run the job now; nothing of
		// ours to release.
		return nil
	}
	return err
}
