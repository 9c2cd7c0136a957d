package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/leasetable"
)

// Any process can follow an election's leaders, candidate or not: each
// new term arrives as it begins, in order.
func ExampleClient_Observe() {
	pool, done := examplePool()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dashboard := exampleClient(ctx, pool, "dashboard")
	defer dashboard.Close(ctx)
	a := exampleClient(ctx, pool, "replica-a")
	defer a.Close(ctx)
	b := exampleClient(ctx, pool, "replica-b")
	defer b.Close(ctx)

	leaders, err := dashboard.Observe(ctx, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	la, err := a.Elect(ctx, "scheduler", "10.0.0.7:8080")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println((<-leaders).Owner)
	_ = la.Resign(ctx)
	lb, err := b.Elect(ctx, "scheduler", "10.0.0.8:8080")
	if err != nil {
		log.Fatal(err)
	}
	leader := <-leaders
	fmt.Println(leader.Owner, leader.Value, leader.Term == lb.Term())
	// Output:
	// replica-a
	// replica-b 10.0.0.8:8080 true
}

// An operator (or code) asks the leader to step down; the leader sees
// the request, finishes its work and resigns.
func ExampleClient_RequestResign() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	replica := exampleClient(ctx, pool, "replica-a")
	defer replica.Close(ctx)
	operator := exampleClient(ctx, pool, "operator")
	defer operator.Close(ctx)

	leadership, err := replica.Elect(ctx, "scheduler", "10.0.0.7:8080")
	if err != nil {
		log.Fatal(err)
	}
	term, err := operator.RequestResign(ctx, "scheduler", "drain node-3")
	if err != nil {
		log.Fatal(err)
	}
	<-leadership.ResignRequested()
	fmt.Println(term == leadership.Term(), errors.Is(leadership.ResignReason(), leasetable.ErrResignRequested))
	_ = leadership.Resign(ctx)
	_, err = operator.Leader(ctx, "scheduler")
	fmt.Println(err)
	// Output:
	// true true
	// leasetable: no leader
}

// A candidate of a newer version ranks higher: it asks the leader of an
// older one to yield as it starts waiting, and gets the next term ahead
// of older candidates of the old version.
func ExamplePreference() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	v1 := exampleClient(ctx, pool, "replica-v1")
	defer v1.Close(ctx)
	v2 := exampleClient(ctx, pool, "replica-v2")
	defer v2.Close(ctx)

	old, err := v1.ElectWith(ctx, "scheduler", "10.0.0.7:8080", leasetable.Preference(1))
	if err != nil {
		log.Fatal(err)
	}
	won := make(chan *leasetable.Leadership)
	go func() {
		l, err := v2.ElectWith(ctx, "scheduler", "10.0.0.8:8080", leasetable.Preference(2))
		if err != nil {
			log.Fatal(err)
		}
		won <- l
	}()
	<-old.ResignRequested() // replica-v2 waits, and outranks it
	_ = old.Resign(ctx)
	leadership := <-won
	leader, err := v1.Leader(ctx, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(leader.Owner, leader.Term > old.Term())
	_ = leadership.Resign(ctx)
	// Output:
	// replica-v2 true
}

func exampleClient(ctx context.Context, pool *pgxpool.Pool, owner string) *leasetable.Client {
	c, err := leasetable.New(ctx, pool, leasetable.Config{Owner: owner})
	if err != nil {
		log.Fatal(err)
	}
	return c
}

// followLeaders is docs/leader-election.md's observer.
func followLeaders(ctx context.Context, client *leasetable.Client) error {
	leaders, err := client.Observe(ctx, "scheduler") // any process: it need not be a candidate
	if err != nil {
		return err
	}
	for leader := range leaders { // closed when ctx ends or the client closes
		log.Printf("leader %s at %s, term %d", leader.Owner, leader.Value, leader.Term)
	}
	return context.Cause(ctx)
}

// campaignAsVersion is docs/leader-election.md's candidate with a
// preference.
func campaignAsVersion(ctx context.Context, pool *pgxpool.Pool, client *leasetable.Client, version int32) error {
	return client.CampaignWith(ctx, "scheduler", "10.0.0.7:8080", leasetable.Callbacks{
		OnStartedLeading: func(ctx context.Context, term int64) {
			runScheduler(ctx, pool, term) // until ctx ends: lost, asked to resign (ErrResignRequested), or Campaign's ctx ended
		},
	}, leasetable.Preference(version)) // once a replica of the newest version runs, it leads
}

// leadUntilAsked is docs/leader-election.md's Elect that steps down on
// request.
func leadUntilAsked(ctx context.Context, client *leasetable.Client, work func(context.Context) error) error {
	leadership, err := client.Elect(ctx, "scheduler", "10.0.0.7:8080")
	if err != nil {
		return err
	}
	defer leadership.Resign(context.WithoutCancel(ctx)) // the next candidate takes over at once
	for {
		select {
		case <-leadership.ResignRequested():
			log.Print(leadership.ResignReason()) // who asked, and why
			return nil
		case <-leadership.Done():
			return leadership.Err()
		default:
		}
		if err := work(leadership.Context()); err != nil {
			return err
		}
	}
}

// leaderReady is docs/leader-election.md's readiness probe.
func leaderReady(leadership *leasetable.Leadership) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		// Unready once leadership ended, or while keep-alives are more
		// than 2s late.
		if err := leadership.Check(2 * time.Second); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
}

var _, _, _, _ = followLeaders, campaignAsVersion, leadUntilAsked, leaderReady
