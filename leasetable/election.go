package leasetable

import (
	"context"
	"encoding/json"
)

// Election is leader election on the lease of one name: the leader is the
// holder, and its term is the lease token, which grows with every new
// leader, so a leader's writes can be fenced with it.
type Election struct {
	c    *Client
	name string
}

// Election returns the election on lease name.
func (c *Client) Election(name string) (*Election, error) {
	if err := checkName("election name", name); err != nil {
		return nil, err
	}
	return &Election{c: c, name: name}, nil
}

// Campaign waits until this client is leader and returns the leadership
// lease: Token is the term, Done closes when leadership is lost, Release
// resigns. value is published with the leadership (Leader reads it), e.g.
// the leader's address.
func (e *Election) Campaign(ctx context.Context, value string) (*Lease, error) {
	meta, err := json.Marshal(map[string]string{"value": value})
	if err != nil {
		return nil, err
	}
	return e.c.acquire(ctx, e.name, meta)
}

// Leader describes the current leader.
type Leader struct {
	Owner string
	Value string
	Term  int64
	// Lease is the leadership lease's row.
	Lease Info
}

// Leader returns the current leader, or ErrNoLeader.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	in, err := e.c.Info(ctx, e.name)
	if err != nil {
		return Leader{}, err
	}
	if !in.Held {
		return Leader{}, ErrNoLeader
	}
	var meta struct {
		Value string `json:"value"`
	}
	_ = json.Unmarshal(in.Metadata, &meta) // metadata written by others may differ
	return Leader{Owner: in.Owner, Value: meta.Value, Term: in.Token, Lease: in}, nil
}

// Elect campaigns, then runs fn as leader with a context cancelled when
// leadership is lost, and resigns when fn returns. term is fn's fencing
// token. It returns fn's error, or an error wrapping ErrLeaseLost when
// leadership was lost before fn returned nil.
func (c *Client) Elect(ctx context.Context, name, value string, fn func(ctx context.Context, term int64) error) error {
	if fn == nil {
		return invalid("nil function")
	}
	e, err := c.Election(name)
	if err != nil {
		return err
	}
	l, err := e.Campaign(ctx, value)
	if err != nil {
		return err
	}
	return c.runUnder(ctx, l, func(ctx context.Context) error { return fn(ctx, l.Token()) })
}
