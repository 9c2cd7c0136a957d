package leasetable

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton/internal/combine"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/giveback"
	"github.com/pgbaton/pgbaton/internal/leaseset"
	"github.com/pgbaton/pgbaton/internal/leasestate"
	"github.com/pgbaton/pgbaton/internal/mailbox"
	"github.com/pgbaton/pgbaton/internal/session"
)

// keeper is a client's one owner of what its goroutines share, as etcd's
// Session and River's elector own theirs: one goroutine (run) owns the
// lease session (internal/session, opened and kept alive in session.go),
// the leases held (internal/leaseset: carried by the session, or loose:
// held by their own deadline once it ended) with one timer for every
// deadline, the queue of things to give back and the CompleteTx
// completions whose transaction's end it has yet to learn
// (internal/giveback), the CompleteAndClaim calls queued per group
// (combine.go), and the LISTEN connection's state (internal/listener,
// through mailbox.Plain). Others talk to it through its mailbox
// (internal/mailbox; Post: a message is a function it runs); its round
// trips run on goroutines of their own (Spawn) that report back by
// message, so it never waits on the database.
// Session deadlines and states, and a Lease's status, are atomics that
// callers read without asking. The package has no mutex of its own: the
// mailbox's is its one lock.
//
// Besides the keeper, the LISTEN loop while a listen slot is held and the
// retention loop, every goroutine of a Client is bounded and started by
// the keeper's Spawn, which Close waits for: statements that may grant
// leases (inFlight), CompleteAndClaim senders, the keeper's round trips
// and OnRenew hooks, removals of waiter registrations. Keep's Work
// goroutines are Keep's own; per session and per Lease there are none.
type keeper struct {
	*mailbox.Mailbox[*keeper]
	c *Client

	// late are grants to give back by request id that came once Close had
	// begun (a reply to a caller that gave up): Close gives them back
	// after its background work ended. Guarded by the mailbox's lock
	// (Locked).
	late []grantRef

	// cur is the session new grants bind to (nil: none yet, or it ended);
	// stored by the keeper, read by grants without asking.
	cur atomic.Pointer[session.Session]
	// using counts the session's uses without a lease, from sessionFor to
	// unuse: grants on their way and waiters.
	using atomic.Int64

	// Owned by the keeper's goroutine.
	sess     *session.Session
	opening  *session.Opening
	leases   *leaseset.Set[*Lease]            // carried by sess, or loose
	back     giveback.Queue[*Lease, grantRef] // by token (released, never completed) and by request id
	settling giveback.Schedule[*Lease]        // handed off, their complete_tx sent
	cc       combine.Queue[*combined]
	timer    *time.Timer
	stopped  bool
}

// grantRef is a request whose grants are to be given back by its id: its
// reply was lost, or its caller gave up.
type grantRef struct {
	s   *session.Session
	ref pgtype.UUID
}

func newKeeper(c *Client) *keeper {
	return &keeper{Mailbox: mailbox.New[*keeper](&c.background), c: c,
		leases: leaseset.New(func(l *Lease) *leasestate.Status { return l.st.Load() })}
}

// run is the keeper's goroutine: messages first, then what is due.
func (k *keeper) run() {
	defer k.c.background.Done()
	k.timer = time.NewTimer(time.Hour)
	defer k.timer.Stop()
	for !k.stopped {
		select {
		case <-k.Signal():
		case <-k.timer.C:
		}
		for _, m := range k.Take() {
			m(k)
		}
		if k.stopped {
			return
		}
		k.tick(time.Now())
	}
}

// tick does what is due at now, and sets the one timer for the next thing
// due.
func (k *keeper) tick(now time.Time) {
	next := time.Hour
	if s := k.sess; s != nil {
		switch end, keep := s.Due(now, k.keepDue(s, false)); {
		case end:
			k.end(s, session.Dead, "no successful keep-alive before the local deadline")
		case keep:
			// Due by a lease that may have ended since: look at the live
			// ones before writing.
			if _, keep = s.Due(now, k.keepDue(s, true)); keep {
				k.keepalive(s, now)
			}
		}
	}
	if s := k.sess; s != nil {
		next = min(next, s.Next(k.keepDue(s, false)).Sub(now))
	}
	if own, ok := k.leases.Due(now, func(l *Lease) { l.deadlinePassed(now, l.sess.Trouble()) }); ok {
		next = min(next, own.Sub(now))
	}
	if at, ok := k.settling.Next(); ok {
		if now.Before(at) {
			next = min(next, at.Sub(now))
		} else {
			k.settle()
		}
	}
	k.timer.Reset(max(next, 0))
}

// keepDue is when s's next keep-alive is due (session.KeepDue); exact
// looks at the live leases only, at the cost of a pass over them.
func (k *keeper) keepDue(s *session.Session, exact bool) time.Time {
	cfg := k.c.cfg
	return s.KeepDue(k.leases.Oldest(exact), cfg.RenewInterval, cfg.TTL-cfg.SafetyMargin)
}

// add keeps leases granted in one round trip; false when the client
// closed (the caller gives them back).
func (k *keeper) add(leases []*Lease) bool {
	return k.Post(func(k *keeper) {
		now := time.Now()
		k.leases.Add(func(l *Lease) bool { return l.sess == k.sess && l.sess.Carries(now) }, leases...)
	})
}

// giveBack queues grants to be given back by token: lost ones, and those
// whose release or completion could not reach the database (released
// then, never completed: a completion whose caller was told it failed
// must leave the item to be claimed again).
func (k *keeper) giveBack(leases []*Lease) {
	k.Post(func(k *keeper) {
		k.back.Add(leases...)
		k.sendBack()
	})
}

// giveBackRef queues the grants of request ref in session s, sent at once
// unless a give-back is on its way (then when it is back).
func (k *keeper) giveBackRef(s *session.Session, ref pgtype.UUID) {
	if k.Post(func(k *keeper) {
		k.back.AddRef(grantRef{s, ref})
		k.sendBack()
	}) {
		return
	}
	k.Locked(func() { k.late = append(k.late, grantRef{s, ref}) })
}

// sendBack sends the give-back queue in the background; what fails stays
// queued until the next keep-alive succeeds, and Close takes what is left
// (what is on its way too: giving back twice is harmless).
func (k *keeper) sendBack() {
	leases, refs, ok := k.back.Send()
	if !ok {
		return
	}
	c := k.c
	ok = k.Spawn(func() {
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.ReleaseTimeout)
		defer cancel()
		var gone []grantRef
		for _, r := range refs {
			if c.releaseRef(ctx, r.s, r.ref) == nil {
				gone = append(gone, r)
			}
		}
		var err error
		if len(leases) > 0 {
			names, tokens := grants(byName(leases))
			_, err = c.releaseMany(ctx, names, tokens, lostNames(leases))
		}
		if err != nil || len(gone) < len(refs) {
			c.log.Debug("pgbaton: giving back grants failed; trying again after the next keep-alive", "leases", len(leases), "requests", len(refs)-len(gone), "error", err)
		}
		k.Post(func(k *keeper) {
			if k.back.Sent(leases, err == nil, refs, gone) {
				k.sendBack() // what was queued meanwhile
			}
		})
	})
	if !ok {
		k.back.Unsent()
	}
}

// settleLater has the keeper learn how the transaction of handed-off
// leases ends. Call it only once their complete_tx was sent: before, an
// unlocked row would look like a rolled-back completion.
func (k *keeper) settleLater(leases []*Lease) {
	if len(leases) == 0 {
		return
	}
	k.Post(func(k *keeper) {
		var handed []*Lease
		for _, l := range leases {
			if l.st.Load().State == leasestate.HandedOff {
				handed = append(handed, l)
			}
		}
		k.settling.Add(time.Now(), handed...)
	})
}

// settle asks, in one statement for all of them, how the transactions of
// the handed-off leases ended: a committed completion's lease ends; a
// rolled-back one's row is released at once, so its item is claimable
// again without waiting for the session to end.
func (k *keeper) settle() {
	c := k.c
	pending := k.settling.Ask()
	ok := k.Spawn(func() {
		settled := c.settle(pending)
		k.Post(func(k *keeper) {
			ended := func(l *Lease) bool { return l.st.Load().State.Ended() }
			k.settling.Answered(time.Now(), pending, ended, settled, c.cfg.RenewInterval)
		})
	})
	if !ok {
		k.settling.Unasked()
	}
}

// settle asks once how pending's transactions ended and ends the leases
// whose transaction did; it reports whether any did.
func (c *Client) settle(pending []*Lease) bool {
	names, tokens := grants(pending)
	ctx, cancel := context.WithTimeout(c.bg, c.cfg.ReleaseTimeout)
	defer cancel()
	rows, err := c.q.LeaseSettleMany(ctx, c.pool, db.LeaseSettleManyParams{Names: names, Tokens: tokens, Owner: c.cfg.Owner})
	if err != nil {
		c.log.Debug("pgbaton: asking how completions in transactions ended failed; asking again", "error", err)
		return false
	}
	var released []string
	settled := giveback.Settled(pending, rows, func(l *Lease, committed bool) {
		if committed {
			l.endHandedOff("committed")
			return
		}
		// Said before Done closes: a Complete after it must not report
		// the item completed.
		l.st.SetReleaseErr(fmt.Errorf("%w: %q token %d: its completion in a transaction rolled back; the item was released, not completed", ErrNotHeld, l.name, l.token))
		l.endHandedOff("rolled back; the item was released")
		released = append(released, l.name)
	})
	c.notifyWaiters(ctx, released)
	return settled
}

// endHandedOff ends a lease completed in a transaction, as released.
func (l *Lease) endHandedOff(how string) {
	l.transition(leasestate.Released, fmt.Errorf("%w: %q token %d: completed in a transaction (%s)", ErrReleased, l.name, l.token, how), "")
}

// leftover is what Close takes from the keeper: the leases still held or
// handed off, and the give-back queue.
type leftover struct {
	held, handed, back []*Lease
	refs               []grantRef
	sess               *session.Session
	calls              []*combined // CompleteAndClaim calls not sent
}

// closeKeeper stops the keeper and returns what it kept; ok is false when
// Close had begun already.
func (c *Client) closeKeeper() (left leftover, ok bool) {
	reply := make(chan leftover, 1)
	if !c.k.Close(func(k *keeper) {
		var left leftover
		left.held, left.handed = k.leases.Open()
		left.back, left.refs = k.back.All()
		left.sess = k.sess
		left.calls = k.cc.All()
		k.cur.Store(nil)
		k.stopped = true
		reply <- left
	}) {
		return leftover{}, false
	}
	return <-reply, true
}
