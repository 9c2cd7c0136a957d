package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/election"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

// Leadership is won by Elect: this client leads while it holds the
// election's lease. The term is the lease token, larger for every new
// leader, so a leader's writes can be fenced with it.
type Leadership struct {
	lease *Lease
	asked *election.Asked // a request to resign, watched by watchResign
}

// CampaignOption sets how a client stands in an election: Preference,
// Ineligible.
type CampaignOption func(*candidacy)

// candidacy is an alias, so CampaignOption reads as it always did while
// the candidacy's rules live in internal/election.
type candidacy = election.Candidacy

// Preference ranks this candidate (default 0): when a term ends, the
// waiting candidate of the highest rank gets the next one (among equals,
// the one that waited longest), and a candidate that starts waiting while
// a leader of a lower rank leads asks that leader to resign. Rank a newer
// version, or the preferred zone, higher.
func Preference(rank int32) CampaignOption { return func(c *candidacy) { c.Rank = rank } }

// Ineligible has CampaignWith stand without ever leading, for a replica that
// runs the candidates' code but must not lead: it returns when its
// context ends and calls no callback. ElectWith refuses it; Observe follows
// the leaders.
func Ineligible() CampaignOption { return func(c *candidacy) { c.Ineligible = true } }

// Elect blocks until this client is the leader of election name (holds its
// lease) or ctx ends. value is published with the leadership for Leader to
// read, e.g. the leader's address. Candidates are served in the order they
// came; ElectWith ranks them.
func (c *Client) Elect(ctx context.Context, name, value string) (*Leadership, error) {
	return c.ElectWith(ctx, name, value)
}

// ElectWith is Elect with options: candidates are served by Preference,
// then in the order they came.
func (c *Client) ElectWith(ctx context.Context, name, value string, opts ...CampaignOption) (*Leadership, error) {
	if err := checkName("election name", name); err != nil {
		return nil, err
	}
	cand, err := election.CandidacyOf(opts)
	if err != nil {
		return nil, err
	}
	if cand.Ineligible {
		return nil, invalid("Elect of %q: an Ineligible client never leads (Observe follows the leaders)", name)
	}
	l, err := c.acquire(ctx, name, election.Metadata(value, cand.Rank), cand.Rank)
	if err != nil {
		return nil, err
	}
	return c.newLeadership(l), nil
}

// Term is the leadership's fencing token.
func (ld *Leadership) Term() int64 { return ld.lease.Token() }

// Lease is the election lease held while leading.
func (ld *Leadership) Lease() *Lease { return ld.lease }

// Done is closed when leadership ends: resigned or lost.
func (ld *Leadership) Done() <-chan struct{} { return ld.lease.Done() }

// Context is cancelled when leadership ends; its cause wraps ErrLeaseLost
// when it was lost.
func (ld *Leadership) Context() context.Context { return ld.lease.Context() }

// Err is nil while leading, like Lease.Err otherwise.
func (ld *Leadership) Err() error { return ld.lease.Err() }

// Resign gives up leadership, waking the other candidates: the first in
// the queue (by Preference, then age) takes over at once.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lease.Release(ctx) }

// ResignRequested is closed when someone asked this leader to step down
// (Client.RequestResign, `pgbaton resign`, or a candidate of a higher
// Preference that started waiting). Leadership goes on until Resign (or a
// loss): finish the term's work cleanly, then Resign. Campaign does that
// for its callback: the term's context ends, with ResignReason as cause.
func (ld *Leadership) ResignRequested() <-chan struct{} { return ld.asked.Requested() }

// ResignReason is nil until ResignRequested is closed, then an error
// wrapping ErrResignRequested that says who asked and why.
func (ld *Leadership) ResignReason() error { return ld.asked.Reason() }

// Check is a readiness check for the leader, as client-go's
// HealthzAdaptor is: nil while this client leads and its keep-alives are
// on time, give or take maxTolerable; an error once leadership has ended,
// or while the last successful keep-alive is older than RenewInterval
// plus maxTolerable (wrapping pgbaton.ErrDegraded: the database is slow
// or unreachable, and unless a keep-alive succeeds leadership ends at the
// local deadline).
func (ld *Leadership) Check(maxTolerable time.Duration) error {
	if maxTolerable < 0 {
		return invalid("Check: maxTolerable must not be negative, got %s", maxTolerable)
	}
	if err := ld.Err(); err != nil {
		return fmt.Errorf("leasetable: not the leader of %q: %w", ld.lease.name, err)
	}
	cfg := ld.lease.c.cfg
	left := time.Until(ld.lease.Deadline())
	// The deadline is TTL - SafetyMargin after the last successful
	// keep-alive was sent, and the next one is due RenewInterval after it.
	if late := cfg.TTL - cfg.SafetyMargin - left - cfg.RenewInterval; late > maxTolerable {
		return fmt.Errorf("%w: leader of %q: keep-alive late by %s; leadership ends in %s unless one succeeds",
			pgbaton.ErrDegraded, ld.lease.name, late.Round(time.Millisecond), left.Round(time.Millisecond))
	}
	return nil
}

// Leader describes the current leader of an election.
type Leader struct {
	Owner string // the leader's client, as its Config.Owner
	// Value is what the leader passed to Campaign or Elect, e.g. its
	// address; empty when the lease's metadata holds no value.
	Value     string
	Term      int64         // the leadership's fencing token (the lease token)
	Remaining time.Duration // how long the leadership lasts without renewal
}

// Leader returns the current leader of election name, or ErrNoLeader.
func (c *Client) Leader(ctx context.Context, name string) (Leader, error) {
	in, err := c.Info(ctx, name)
	if err != nil {
		return Leader{}, err
	}
	if !in.Held {
		return Leader{}, ErrNoLeader
	}
	return Leader{Owner: in.Owner, Value: election.ValueOf(in.Metadata), Term: in.Token, Remaining: in.Remaining}, nil
}

// Callbacks are Campaign's hooks, the same for both lock layers: term is
// the leadership's fencing token.
type Callbacks = pgbaton.Callbacks

// Campaign campaigns for election name until ctx ends: it waits to become
// leader (by Preference, then in the order candidates came), runs
// OnStartedLeading with the term (the lease token) for the term, and after
// the term ends (lost, asked to resign, or OnStartedLeading returned)
// campaigns again after a pause of about 100 ms (about RenewInterval when
// the election failed). Terms in this client never overlap:
// OnStoppedLeading has run before the next OnStartedLeading. A request to
// resign ends the term's context with a cause wrapping ErrResignRequested;
// the term is resigned once OnStartedLeading returns. It returns the
// context's cause when ctx ends, or at once for errors retrying cannot fix
// (bad input, client closed, schema, standby, unsupported server). A term
// granted just as ctx ended is given back in the background, as the grant
// of an Acquire given up is (Close waits for it). The loop is the one
// advisory's Campaign runs.
func (c *Client) Campaign(ctx context.Context, name, value string, cb Callbacks) error {
	return c.CampaignWith(ctx, name, value, cb)
}

// CampaignWith is Campaign with options: by Preference, or Ineligible, when
// it never leads and waits for ctx to end.
func (c *Client) CampaignWith(ctx context.Context, name, value string, cb Callbacks, opts ...CampaignOption) error {
	if ctx == nil || cb.OnStartedLeading == nil {
		return invalid("Campaign needs a context and Callbacks.OnStartedLeading")
	}
	if err := checkName("election name", name); err != nil {
		return err
	}
	cand, err := election.CandidacyOf(opts)
	if err != nil {
		return err
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	if cand.Ineligible {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-c.bg.Done():
			return pgbaton.ErrClosed
		}
	}
	elect := election.ElectFunc(func(ctx context.Context) (election.Term, error) {
		ld, err := c.ElectWith(ctx, name, value, opts...)
		if err != nil {
			return nil, err
		}
		return term{ld}, nil
	})
	return election.Campaign(ctx, elect, cb, election.Config{
		Retry: c.cfg.RenewInterval, Permanent: pgerr.Unfixable, Logger: c.log, What: name,
	})
}

type term struct{ *Leadership }

func (t term) Number() int64 { return t.Term() }

// Context ends the term's work when leadership ends or the leader is asked
// to resign.
func (t term) Context() context.Context { return t.asked.Context() }
