package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/jobs"
	"github.com/pgbaton/pgbaton/retention"
)

// A nil *leasetable.Client is bad input like any other: a typed error, not
// a panic, from every function that takes one.
func TestNilClientIsInvalid(t *testing.T) {
	ctx := context.Background()
	err := jobs.Do(ctx, nil, "job", func(context.Context, *jobs.Run) error { return nil })
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = jobs.Runs(ctx, nil, "job", 1)
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	_, err = jobs.ClaimSlot(ctx, nil, "job", time.Now())
	require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
	require.ErrorIs(t, retention.Run(ctx, nil, retention.Config{}), pgbaton.ErrInvalidArgument)
}
