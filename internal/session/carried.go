package session

import (
	"fmt"
	"time"
)

// The rules for a lease the session carries: a lease is held until the
// later of its own deadline and its session's.

// Deadline is the local deadline of a lease granted in s with its own
// deadline own: the later of own and, while s carries the lease at now,
// s's.
func (s *Session) Deadline(own, now time.Time) time.Time {
	if d := s.Until(); s.Carries(now) && d.After(own) {
		return d
	}
	return own
}

// ExpiresAt is when a lease granted in s, whose own grant expires at own
// by the database clock, expires there unless kept alive further: the
// later of own and, while s carries the lease at now, s's expiry.
func (s *Session) ExpiresAt(own, now time.Time) time.Time {
	if e := s.Expires(); s.Carries(now) && e.After(own) {
		return e
	}
	return own
}

// RenewFailure reports whether a lease granted in s, with its own
// deadline own, whose deadline was found passed at now, was lost to a
// renewal failure rather than expired: keep-alives were failing or
// hanging (trouble), unless it was noticed so late (margin, the safety
// margin, or lateNotice if longer) that the process must have been paused.
func (s *Session) RenewFailure(own time.Time, trouble bool, now time.Time, margin time.Duration) bool {
	passed := own
	if s.Until().After(passed) {
		passed = s.Until() // the session's last deadline, ended or not
	}
	return trouble && now.Sub(passed) < max(margin, lateNotice)
}

// lateNotice is how late after a deadline a loss noticed while keep-alives
// fail still counts as a renewal failure, when the safety margin is
// shorter: later than that, the process must have been paused.
const lateNotice = 50 * time.Millisecond

// StepWhy says why a clock step of step, seen by a keep-alive, loses
// leases: it is more than the safety margin.
func StepWhy(step, margin time.Duration) string {
	return fmt.Sprintf("the database's clock moved %s further than this client's since the previous keep-alive, more than the safety margin %s",
		step.Round(time.Millisecond), margin)
}

// LostWhy says why grants of a session that a look after its keep-alive
// (Kept) found gone from the database are lost: force-released by an
// operator, or, after a timeline change (failedOver), lost with the old
// primary.
func LostWhy(failedOver bool) string {
	if failedOver {
		return "is not in the database after a timeline change (a failover lost its grant), or was released by an operator"
	}
	return "was released by an operator"
}

// Overdue describes, for a readiness check at now, the leases s carries
// (leases reads them) once its last successful keep-alive is overdue:
// sent more than renew and a half ago, so that one late keep-alive on a
// busy machine is not a failure. It returns how many there are, and names
// at most 5 of them and how many more; nothing while keep-alives are on
// time.
func Overdue[L interface {
	Name() string
	Token() int64
	Deadline() time.Time
}](s *Session, leases func() []L, renew time.Duration, now time.Time) (n int, out []string) {
	since := now.Sub(s.RenewedAt)
	if since <= renew*3/2 {
		return 0, nil
	}
	all := leases()
	for _, l := range all[:min(len(all), 5)] {
		out = append(out, fmt.Sprintf("%q token %d (last kept alive %s ago, lost in %s)", l.Name(), l.Token(),
			since.Round(time.Millisecond), max(l.Deadline().Sub(now), 0).Round(time.Millisecond)))
	}
	if len(all) > len(out) {
		out = append(out, fmt.Sprintf("and %d more", len(all)-len(out)))
	}
	return len(all), out
}
