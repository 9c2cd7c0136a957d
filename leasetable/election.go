package leasetable

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/pgbaton/pgbaton"
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
	Owner string
	Value string
	Term  int64
	// Remaining is how long the leadership lasts without renewal.
	Remaining time.Duration
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

// Callbacks are Campaign's hooks.
type Callbacks struct {
	// OnStartedLeading runs, on Campaign's goroutine, each time this client
	// becomes leader, with the term's fencing token. Its context is
	// cancelled when leadership is lost or Campaign's context ends.
	// Leadership is kept until it returns (or is lost), then resigned.
	// Required.
	OnStartedLeading func(ctx context.Context, term int64)
	// OnStoppedLeading runs after each term, once OnStartedLeading has
	// returned and leadership was resigned or lost. Optional.
	OnStoppedLeading func()
}

// Campaign campaigns for election name until ctx ends: it waits to become
// leader, runs OnStartedLeading for the term, and after the term ends
// campaigns again. Terms in this client never overlap. It returns the
// context's cause when ctx ends, or at once for errors retrying cannot fix
// (bad input, client closed, schema, standby); other errors are retried
// after about a renew interval.
func (c *Client) Campaign(ctx context.Context, name, value string, cb Callbacks) error {
	if ctx == nil || cb.OnStartedLeading == nil {
		return invalid("Campaign needs a context and Callbacks.OnStartedLeading")
	}
	if err := checkName("election name", name); err != nil {
		return err
	}
	for {
		ld, err := c.Elect(ctx, name, value)
		switch {
		case ctx.Err() != nil:
			if ld != nil {
				_ = ld.Resign(context.WithoutCancel(ctx))
			}
			return context.Cause(ctx)
		case err != nil && permanent(err):
			return err
		case err != nil:
			c.log.Warn("pgbaton: campaign: election failed; retrying", "election", name, "error", err)
			t := time.NewTimer(c.cfg.RenewInterval + jitter(c.cfg.TTL))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return context.Cause(ctx)
			}
			continue
		}
		_ = c.runUnder(ctx, ld.lease, func(ctx context.Context) error {
			cb.OnStartedLeading(ctx, ld.Term())
			return nil
		})
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
}

func permanent(err error) bool {
	for _, e := range []error{pgbaton.ErrInvalidArgument, pgbaton.ErrClosed, pgbaton.ErrNotMigrated,
		pgbaton.ErrSchemaTooNew, pgbaton.ErrStandby} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
