package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/leasetable"
)

// ErrNotLeader is what IsLeader returns on schedulers that are not the
// leader: gocron then skips the run.
var ErrNotLeader = errors.New("gocronlock: this scheduler is not the leader")

// Elector is a gocron.Elector: it campaigns in the background for a
// pgbaton election, and IsLeader is true while it holds the term.
type Elector struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	term context.Context // the current term's context, nil when not leading
	err  error           // why campaigning stopped
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning for election name through client. Close
// stops campaigning and resigns.
func NewElector(client *leasetable.Client, name string) (*Elector, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil leasetable client", pgbaton.ErrInvalidArgument)
	}
	if name == "" {
		return nil, fmt.Errorf("%w: empty election name", pgbaton.ErrInvalidArgument)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		err := client.Campaign(ctx, name, client.Owner(), leasetable.Callbacks{
			OnStartedLeading: func(term context.Context, _ int64) {
				e.mu.Lock()
				e.term = term
				e.mu.Unlock()
				<-term.Done()
			},
			OnStoppedLeading: func() {
				e.mu.Lock()
				e.term = nil
				e.mu.Unlock()
			},
		})
		e.mu.Lock()
		e.term, e.err = nil, err
		e.mu.Unlock()
	}()
	return e, nil
}

// IsLeader returns nil while this scheduler leads, else ErrNotLeader (or
// why campaigning stopped).
func (e *Elector) IsLeader(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.term != nil && e.term.Err() == nil:
		return nil
	case e.err != nil && !errors.Is(e.err, context.Canceled):
		return fmt.Errorf("%w: campaign stopped: %w", ErrNotLeader, e.err)
	}
	return ErrNotLeader
}

// Close stops campaigning and resigns leadership, if held.
func (e *Elector) Close() {
	e.cancel()
	<-e.done
}
