// Package jobs runs scheduled and long jobs on leases: job runs recorded
// in pgbaton.job_run with checkpoints fenced in pgbaton.fenced_value, and
// cron slots claimed once across nodes in pgbaton.cron_slot.
//
//	if won, err := jobs.ClaimSlot(ctx, client, "rollup", slot); err != nil || !won {
//		return err // another node runs this slot
//	}
//	err := jobs.Do(ctx, client, "rollup", func(ctx context.Context, run *jobs.Run) error {
//		var p progress
//		if _, err := run.LastCheckpoint(&p); err != nil { // where a lost run stopped
//			return err
//		}
//		... // work, then run.Checkpoint(ctx, p): refused once the lease is lost
//	})
//
// Do acquires the job's lease (a leasetable lease named after the job),
// records the run, runs the function with a context that ends when the
// lease is lost, and records how it ended (Started, Succeeded, Failed,
// Cancelled, Lost); Runs lists a job's runs, newest first. A checkpoint is
// written with the run's token through package fencedwrite, so a run that
// lost its lease can never overwrite the progress of the one that took
// over. ClaimSlot is true for exactly one caller per (job, scheduled time),
// however skewed the nodes' tickers.
//
// Every call takes the *leasetable.Client the caller already has, so a
// job's lease, its lease session and its owner are the client's.
//
// Rows of pgbaton.job_run and pgbaton.cron_slot pile up with use; package
// retention prunes them (a job's newest run is always kept).
//
// Bad input returns an error wrapping pgbaton.ErrInvalidArgument and sends
// nothing; a closed client gives pgbaton.ErrClosed. See [Cron jobs] and
// [Work queues].
//
// [Cron jobs]: https://github.com/pgbaton/pgbaton/blob/main/docs/cron-jobs.md
// [Work queues]: https://github.com/pgbaton/pgbaton/blob/main/docs/work-queues.md
package jobs

// Layering, for maintainers: jobs is built on two layers and belongs to
// neither. It imports leasetable (the job's lease) and fencedwrite (the
// checkpoints), and neither of them imports it (the module's deps_test.go
// checks that imports only go down). It uses only what leasetable exports
// for packages built on it: Client.Pool, Lease.OnRenew (the run's
// heartbeat moves with every keep-alive) and Lease.Do (the function runs
// under the held lease). Its statements are in queries/jobs.sql.
