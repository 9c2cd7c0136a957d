package jobs

import (
	"fmt"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/names"
	"github.com/pgbaton/pgbaton/internal/refusal"
	"github.com/pgbaton/pgbaton/leasetable"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{pgbaton.ErrInvalidArgument}, args...)...)
}

// checkJob refuses a job name the database would refuse, before anything
// is sent.
func checkJob(job string) error {
	if p := names.Problem("job name", job, leasetable.MaxNameLen); p != "" {
		return invalid("%s", p)
	}
	return nil
}

// dbError names the operation and maps refusals to the shared sentinels,
// keeping the cause.
func dbError(op string, err error) error { return refusal.Wrap("jobs: "+op, err) }
