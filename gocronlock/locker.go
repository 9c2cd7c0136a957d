package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/leasetable"
)

var (
	// ErrSlotTaken is what Lock returns when another scheduler has claimed
	// the run's scheduled slot: gocron skips the run here, as it should.
	ErrSlotTaken = errors.New("gocronlock: the slot was claimed by another scheduler")
	// ErrNotBound is what Lock returns before the Locker knows its
	// scheduler (Locker.NewScheduler or Locker.Bind): without it the
	// Locker cannot tell which slot a run is for.
	ErrNotBound = errors.New("gocronlock: the Locker is not bound to a scheduler; use Locker.NewScheduler or Locker.Bind")
	// ErrDuplicateJobName is what Lock returns when the scheduler has more
	// than one job of the name gocron locks by: the Locker cannot tell
	// their slots apart. Give each job its own gocron.WithName.
	ErrDuplicateJobName = errors.New("gocronlock: more than one job has this name; give each job its own gocron.WithName")
)

// unscheduledTolerance is how far in the future the job's next scheduled
// time may be for a run still to count as that slot's: a timer that fired
// a little early by the wall clock (a clock step) still claims its slot,
// while RunNow, which fires whenever asked, claims none unless it comes
// this close to a slot.
const unscheduledTolerance = time.Second

// Config configures a Locker. The zero value is usable.
type Config struct {
	// Prefix goes before gocron's job name to form the names of the job's
	// slots (pgbaton.cron_slot) and of its run lease, so that they do not
	// collide with other jobs or leases. Default "gocron:".
	Prefix string
	// Logger gets an Error when a run cannot be locked for a reason that
	// needs fixing (no scheduler bound, duplicate job names), a Warn when a
	// run lost its lease before it ended, and a Debug for each run left to
	// another scheduler. Default: discard.
	Logger *slog.Logger
}

// Locker is a gocron.Locker that runs each scheduled slot of a job once
// across all schedulers, on pgbaton's cron slots and leases. One Locker
// serves one scheduler: create the scheduler with Locker.NewScheduler, or
// Bind it. Close the Locker when the scheduler has stopped.
type Locker struct {
	client *leasetable.Client
	cfg    Config
	ctx    context.Context // ends at Close: stops waits for a run lease
	cancel context.CancelFunc

	mu     sync.Mutex
	sched  gocron.Scheduler
	closed bool
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker claiming slots and taking leases through
// client.
func NewLocker(client *leasetable.Client, cfg Config) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil leasetable client", pgbaton.ErrInvalidArgument)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "gocron:"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Locker{client: client, cfg: cfg, ctx: ctx, cancel: cancel}, nil
}

// NewScheduler creates a gocron scheduler with opts and this Locker as its
// distributed locker, bound to it.
func (l *Locker) NewScheduler(opts ...gocron.SchedulerOption) (gocron.Scheduler, error) {
	if err := l.bindable(); err != nil {
		return nil, err
	}
	s, err := gocron.NewScheduler(append(opts[:len(opts):len(opts)], gocron.WithDistributedLocker(l))...)
	if err != nil {
		return nil, err
	}
	if err := l.Bind(s); err != nil {
		_ = s.Shutdown()
		return nil, err
	}
	return s, nil
}

// Bind tells the Locker the scheduler whose jobs it locks, for a scheduler
// created with gocron.WithDistributedLocker(l) or jobs with
// gocron.WithDistributedJobLocker(l). Lock reads from it the scheduled
// time of each run. Bind before the scheduler starts.
func (l *Locker) Bind(s gocron.Scheduler) error {
	if s == nil {
		return fmt.Errorf("%w: nil scheduler", pgbaton.ErrInvalidArgument)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return pgbaton.ErrClosed
	case l.sched == s:
		return nil
	case l.sched != nil:
		return fmt.Errorf("%w: the Locker is bound to another scheduler already; use one Locker per scheduler", pgbaton.ErrInvalidArgument)
	}
	l.sched = s
	return nil
}

func (l *Locker) bindable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return pgbaton.ErrClosed
	case l.sched != nil:
		return fmt.Errorf("%w: the Locker is bound to another scheduler already; use one Locker per scheduler", pgbaton.ErrInvalidArgument)
	}
	return nil
}

// Lock claims the run of job key that gocron is about to start: its
// scheduled slot, then the job's run lease. It fails, and gocron skips the
// run on this scheduler, when another scheduler claimed the slot
// (ErrSlotTaken), when an earlier run of the job still holds the lease
// when the next slot is due (an error wrapping leasetable.ErrHeld), or
// when the Locker is closed or not bound. See the package documentation.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	l.mu.Lock()
	closed, s := l.closed, l.sched
	l.mu.Unlock()
	if closed {
		return nil, pgbaton.ErrClosed
	}
	if s == nil {
		l.cfg.Logger.Error("gocronlock: run not locked", "job", key, "error", ErrNotBound)
		return nil, ErrNotBound
	}
	r, err := runOf(s, key, time.Now())
	if err != nil {
		l.cfg.Logger.Error("gocronlock: run not locked", "job", key, "error", err)
		return nil, err
	}
	name := l.cfg.Prefix + key
	if r.scheduled {
		won, err := jobs.ClaimSlot(ctx, l.client, name, r.slot)
		if err != nil {
			return nil, err
		}
		if !won {
			l.cfg.Logger.Debug("gocronlock: slot run elsewhere", "job", key, "slot", r.slot)
			return nil, fmt.Errorf("%w: job %q, slot %s", ErrSlotTaken, key, r.slot.Format(time.RFC3339Nano))
		}
	}
	lease, err := l.lease(ctx, name, r.next)
	if err != nil {
		return nil, err
	}
	return &jobLock{lease: lease, grace: l.client.Config().TTL, log: l.cfg.Logger}, nil
}

// lease takes the job's run lease, which keeps runs of the job from
// overlapping. A run whose slot it has claimed waits for an earlier run
// still holding it, until the next slot is due: a late Unlock does not
// lose a slot, and a run longer than the interval skips the slots it
// overlaps instead of queueing them up.
func (l *Locker) lease(ctx context.Context, name string, until time.Time) (*leasetable.Lease, error) {
	if until.IsZero() {
		return l.client.TryAcquire(ctx, name)
	}
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	stop := context.AfterFunc(l.ctx, cancel)
	defer stop()
	lease, err := l.client.Acquire(wctx, name)
	switch {
	case err == nil:
		return lease, nil
	case l.ctx.Err() != nil:
		return nil, fmt.Errorf("gocronlock: %s: %w", name, pgbaton.ErrClosed)
	case ctx.Err() == nil && wctx.Err() != nil:
		return nil, fmt.Errorf("gocronlock: %s: an earlier run still runs at the next slot: %w: %w", name, leasetable.ErrHeld, err)
	}
	return nil, err
}

// Close makes later Locks fail with pgbaton.ErrClosed and ends their
// waits for a run lease. Runs already locked keep their lease until their
// Unlock.
func (l *Locker) Close(context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	return nil
}

type jobLock struct {
	lease *leasetable.Lease
	grace time.Duration // how long Unlock tries: the lease expires by then anyway
	log   *slog.Logger
	once  sync.Once
	err   error
}

// Unlock releases the run's lease. It does so even when gocron passes a
// context that ended (the job was removed or the scheduler shut down
// while it ran), so the next slot does not wait for the lease to expire.
func (j *jobLock) Unlock(ctx context.Context) error {
	j.once.Do(func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), j.grace)
		defer cancel()
		j.err = j.lease.Release(rctx)
		if errors.Is(j.err, leasetable.ErrLeaseLost) {
			j.log.Warn("gocronlock: the run lost its lease before it ended; another run may have overlapped it",
				"lease", j.lease.Name(), "error", j.err)
		}
	})
	return j.err
}
