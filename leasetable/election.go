package leasetable

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/election"
)

// Leadership is won by Elect: this client leads while it holds the
// election's lease. The term is the lease token, larger for every new
// leader, so a leader's writes can be fenced with it.
type Leadership struct {
	lease *Lease
}

// Elect blocks until this client is the leader of election name (holds its
// lease) or ctx ends. value is published with the leadership for Leader to
// read, e.g. the leader's address.
func (c *Client) Elect(ctx context.Context, name, value string) (*Leadership, error) {
	if err := checkName("election name", name); err != nil {
		return nil, err
	}
	meta, err := json.Marshal(map[string]string{"value": value})
	if err != nil {
		return nil, invalid("election value: %v", err)
	}
	l, err := c.acquire(ctx, name, meta)
	if err != nil {
		return nil, err
	}
	return &Leadership{lease: l}, nil
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

// Resign gives up leadership, waking the other candidates.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lease.Release(ctx) }

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
	var meta struct {
		Value string `json:"value"`
	}
	_ = json.Unmarshal(in.Metadata, &meta) // metadata written by other tools may differ
	return Leader{Owner: in.Owner, Value: meta.Value, Term: in.Token, Remaining: in.Remaining}, nil
}

// Callbacks are Campaign's hooks, the same for both lock layers: term is
// the leadership's fencing token.
type Callbacks = pgbaton.Callbacks

// Campaign campaigns for election name until ctx ends: it waits to become
// leader, runs OnStartedLeading with the term (the lease token) for the
// term, and after the term ends (lost or OnStartedLeading returned)
// campaigns again after a pause of about 100 ms (about RenewInterval when
// the election failed). Terms in this client never overlap:
// OnStoppedLeading has run before the next OnStartedLeading. It returns
// the context's cause when ctx ends, or at once for errors retrying cannot
// fix (bad input, client closed, schema, standby, unsupported server). The
// loop is the one advisory's Campaign runs.
func (c *Client) Campaign(ctx context.Context, name, value string, cb Callbacks) error {
	if ctx == nil || cb.OnStartedLeading == nil {
		return invalid("Campaign needs a context and Callbacks.OnStartedLeading")
	}
	if err := checkName("election name", name); err != nil {
		return err
	}
	return election.Campaign(ctx, elector{c, name, value}, cb, election.Config{
		Retry: c.cfg.RenewInterval, Permanent: permanent, Logger: c.log, What: name,
	})
}

// elector is a Client electing on one name, for the shared campaign loop.
type elector struct {
	c           *Client
	name, value string
}

func (e elector) Elect(ctx context.Context) (election.Term, error) {
	ld, err := e.c.Elect(ctx, e.name, e.value)
	if err != nil {
		return nil, err
	}
	return term{ld}, nil
}

type term struct{ *Leadership }

func (t term) Number() int64 { return t.Term() }

func permanent(err error) bool {
	for _, e := range []error{pgbaton.ErrInvalidArgument, pgbaton.ErrClosed, pgbaton.ErrNotMigrated,
		pgbaton.ErrSchemaTooNew, pgbaton.ErrStandby, pgbaton.ErrUnsupportedServer} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
