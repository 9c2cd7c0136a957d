package gocronlock

import (
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// run is what Lock needs to know about the run gocron is starting.
type run struct {
	scheduled bool      // the run is for a slot of the schedule (not RunNow)
	slot      time.Time // the slot, the same on every scheduler
	next      time.Time // when the slot after it is due; zero if unknown
}

// runOf finds the slot of the run of job key that gocron is starting at
// now. gocron's Locker interface passes only the job's name, but gocron
// calls Lock before it moves the job on to its next run: the job's
// NextRun is then still the scheduled time that fired. A NextRun more than
// unscheduledTolerance after now means the run was not scheduled
// (RunNow); it claims no slot.
//
// Scheduled times of duration jobs depend on when each scheduler started,
// so for them the slot is the scheduled time truncated to the interval
// (the shortest interval, for random durations), counted from the zero
// time as time.Truncate does: the same cell on every scheduler, one run
// per cell. Every other schedule (cron, daily, weekly, monthly, one-time)
// fires at the same wall-clock times on every scheduler: the slot is the
// scheduled time itself.
func runOf(s gocron.Scheduler, key string, now time.Time) (run, error) {
	var job gocron.Job
	for _, j := range s.Jobs() {
		if j.Name() != key {
			continue
		}
		if job != nil {
			return run{}, fmt.Errorf("%w: %q", ErrDuplicateJobName, key)
		}
		job = j
	}
	if job == nil {
		return run{}, fmt.Errorf("gocronlock: job %q: %w", key, gocron.ErrJobNotFound)
	}
	times, err := job.NextRuns(2)
	if err != nil {
		return run{}, fmt.Errorf("gocronlock: job %q: %w", key, err)
	}
	if len(times) == 0 || times[0].After(now.Add(unscheduledTolerance)) {
		return run{}, nil
	}
	r := run{scheduled: true, slot: times[0]}
	if len(times) > 1 {
		r.next = times[1]
	}
	switch sch := job.Schedule().(type) {
	case gocron.DurationJobSchedule:
		r.slot = r.slot.Truncate(sch.Duration)
	case gocron.DurationRandomJobSchedule:
		r.slot = r.slot.Truncate(sch.Min)
	}
	return r, nil
}
