// Package gocronlock runs github.com/go-co-op/gocron/v2 jobs on many
// schedulers (pods, VMs) so that each scheduled run happens once, on one
// of them, on pgbaton's cron slots and leases.
//
//	client, _ := leasetable.New(ctx, pool, leasetable.Config{})
//	locker, _ := gocronlock.NewLocker(client, gocronlock.Config{})
//	defer locker.Close(ctx)
//	s, _ := locker.NewScheduler() // gocron.WithDistributedLocker(locker), bound to it
//	s.NewJob(gocron.CronJob("*/5 * * * *", false), gocron.NewTask(report), gocron.WithName("report"))
//	s.Start()
//
// # One run per scheduled slot
//
// Locker is a gocron.Locker. gocron asks it, on every scheduler, whether
// to start a run, passing only the job's name. A lock held for the run,
// or kept for a while after it, cannot make that answer "once per tick":
// the schedulers' tickers fire at different moments (clock skew, start
// times, a loaded machine), so a short hold lets a late ticker run the
// tick again and a long one makes an early ticker miss the next tick.
// Measured with three schedulers and a job every second, a lease kept
// for one second after each run ran 19 of 32 ticks and missed 13.
//
// So the Locker keys each run on its scheduled slot. gocron calls Lock
// before it moves the job on to its next run, so the job's NextRun is
// still the scheduled time that fired; Lock reads it from the scheduler
// the Locker is bound to (Locker.NewScheduler creates one bound; Bind
// binds one you create with gocron.WithDistributedLocker) and claims the
// slot with jobs.ClaimSlot(client, Prefix + job name, slot), which is
// true for exactly one scheduler per slot, however skewed the tickers.
// The others get ErrSlotTaken and gocron skips the run there. Three
// schedulers, one job every second: 32 of 32 ticks ran exactly once, none
// missed, none doubled.
//
// What the slot is: for cron, daily, weekly, monthly and one-time jobs,
// the scheduled time itself, the same wall-clock time on every scheduler
// (give them all the same schedule and gocron.WithLocation). For duration
// jobs, whose times depend on when each scheduler started, the scheduled
// time truncated to the interval (to the shortest one for random
// durations), counted from the zero time as time.Truncate does: every
// interval-long cell runs the job once, on the scheduler whose time in it
// comes first. Use gocron.WithStartAt on a multiple of the interval to
// make the runs land on the cells' starts.
//
// # Runs do not overlap
//
// A run also takes the job's lease (the same name), renewed while it runs
// and released by Unlock, as gocron's Locker contract expects: a job never
// runs on two schedulers at once, however long it runs. A run whose slot
// has come while an earlier run still holds the lease waits for it, but
// only until the next slot is due; then it gives up with an error
// wrapping leasetable.ErrHeld, so a run longer than the interval skips the
// slots it overlaps rather than queueing them up (Kubernetes' "Forbid"
// concurrency policy). Skipped slots are recorded as claimed in
// pgbaton.cron_slot by the scheduler that skipped them.
//
// # Limits
//
// Runs that are not scheduled (Job.RunNow; a NextRun more than a second
// ahead) claim no slot: they run under the job's lease only. Job names
// must be unique in a scheduler, since gocron locks by name: two jobs of
// one name (gocron names a job after its function unless told otherwise)
// fail with ErrDuplicateJobName. A Locker serves one scheduler. Lock
// errors that need fixing are logged to Config.Logger as well as passed to
// gocron, which reports them only to an AfterLockError listener.
//
// Each scheduled run adds a row to pgbaton.cron_slot (the record of who
// ran which slot): a job every second adds 86,400 rows a day. Run
// retention.Run in the service to prune them (after 7 days by default,
// retention.Config.CronSlots).
//
// A lost lease (the process paused past its TTL, the database unreachable)
// cannot stop a job that is already running: gocron gives jobs no context
// tied to the lock. Jobs whose double run would corrupt data should write
// through package fencedwrite.
//
// Elector is a gocron.Elector: one scheduler, the leader of a pgbaton
// election, runs all jobs; when it dies, another takes over within the
// lease TTL. See [Cron jobs] and [Leader election].
//
// [Cron jobs]: https://github.com/pgbaton/pgbaton/blob/main/docs/cron-jobs.md
// [Leader election]: https://github.com/pgbaton/pgbaton/blob/main/docs/leader-election.md
package gocronlock
