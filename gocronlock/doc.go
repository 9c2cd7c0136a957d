// Package gocronlock runs github.com/go-co-op/gocron/v2 jobs on many
// schedulers (pods, VMs) so that each run happens on one of them only, on
// pgbaton leases.
//
// Locker is a gocron.Locker: a job run takes the lease named Prefix + job
// name, which is renewed automatically while the job runs — so a long job
// stays locked however long it takes (gocron's Lock has no Extend, and does
// not need one). Because every scheduler's ticker fires at a slightly
// different moment, a job that finishes quickly would let a late ticker run
// it again; the lease is therefore kept for at least Config.MinHold after it
// was taken, as gocron's interface asks of a locker ("handles time splay
// between schedulers").
//
// Elector is a gocron.Elector: one scheduler, the leader of a pgbaton
// election, runs all jobs; when it dies, another takes over within the
// lease TTL.
//
//	client, _ := leasetable.New(ctx, pool, leasetable.Config{})
//	locker, _ := gocronlock.NewLocker(client, gocronlock.Config{})
//	defer locker.Close(ctx)
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// A lost lease (the process paused past its TTL, the database unreachable)
// cannot stop a job that is already running: gocron gives jobs no context
// tied to the lock. Jobs whose double run would corrupt data should write
// through package fencedwrite.
package gocronlock
