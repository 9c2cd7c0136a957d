package replication

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errNoSync = errors.New("no sync standby")

func TestStatusErr(t *testing.T) {
	for _, s := range []Status{
		{},
		{Standbys: 2, SyncStandbys: 1, SynchronousCommit: "on"},
		{Standbys: 1, SyncStandbys: -1, SynchronousStandbyNames: "*", SynchronousCommit: "remote_apply"},
	} {
		assert.NoError(t, s.Err(errNoSync), "%+v", s)
	}
	for s, want := range map[Status]string{
		{Standbys: 2}:                   `no sync standby (2 standby(s), synchronous_standby_names "")`,
		{Standbys: 1, SyncStandbys: -1}: `no sync standby (1 standby(s), synchronous_standby_names "")`,
		{Standbys: 1, SyncStandbys: 1, SynchronousCommit: "local"}: "no sync standby: synchronous_commit is local, so commits do not wait for the synchronous standby",
	} {
		err := s.Err(errNoSync)
		require.ErrorIs(t, err, errNoSync, "%+v", s)
		assert.Equal(t, want, err.Error())
	}
}

func TestGraceString(t *testing.T) {
	until := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for g, want := range map[Grace]string{
		{Enabled: true, LongestTTL: time.Minute}:                                "on; none imposed (longest TTL in use 1m0s)",
		{Active: true, FromTimeline: 1, ToTimeline: 2, LongestTTL: time.Minute}: "off; holding every grant back: timeline 1 -> 2 not stored yet, then 1m0s (longest TTL in use)",
		{Enabled: true, Active: true, Until: until, StartedAt: until.Add(-time.Minute), FromTimeline: 1, ToTimeline: 2,
			LongestTTL: time.Minute, Remaining: 1500 * time.Microsecond}: "on; holding every grant back for 2ms more, until 2025-01-02T03:04:05Z (timeline 1 -> 2 at 2025-01-02T03:03:05Z, longest TTL in use 1m0s)",
		{Enabled: true, Until: until, FromTimeline: 1, ToTimeline: 2, LongestTTL: time.Minute}: "on; last ended 2025-01-02T03:04:05Z (timeline 1 -> 2, longest TTL in use 1m0s)",
	} {
		assert.Equal(t, want, g.String())
	}
}
