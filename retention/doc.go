// Package retention keeps the pgbaton tables that grow with use bounded,
// outside leasetable's own (which a leasetable.Client prunes itself): cron
// slots, job runs, the audit log, fenced values, advisory lock names and
// idempotent-consumer records.
//
//	go retention.Run(ctx, client, retention.Config{}) // on every node; one prunes at a time
//
// Run prunes in the background of a service: every Config.Interval it
// tries to take the lease leasetable.RetentionLease and, if it gets it,
// deletes rows older than their retention, oldest first, in small batches
// (Config.Batch). Prune is one pass, for a scheduled job of your own.
//
// Each field of Config is how long rows of one kind are kept, with its
// default (cron slots 7 days, job runs 30 days, the audit log a year, ...):
// zero keeps the default, a negative duration keeps rows forever. The
// rules are those of the SQL function pgbaton.prune. Bad input returns an
// error wrapping pgbaton.ErrInvalidArgument. See [Operating].
//
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
package retention
