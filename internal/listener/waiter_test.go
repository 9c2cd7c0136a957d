package listener

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Without LISTEN only a plain waiter for a lease registers by its looks;
// it is paced by its place in the queue, and its wait ends with a wake-up
// or the client.
func TestJoinWithoutListen(t *testing.T) {
	client, closeClient := context.WithCancel(context.Background())
	ln := New(Config{Context: client, NoListen: true, PollInterval: time.Second, TTL: time.Minute,
		CheckOpen: func() error { return nil }, NewID: func(string) string { return "w/1" }})
	for _, tc := range []struct {
		what  string
		group bool
		rank  pgtype.Int4
		lazy  bool
	}{
		{"lease", false, pgtype.Int4{Valid: true}, true},
		{"group", true, pgtype.Int4{Valid: true}, false},
		{"preferred candidate", false, pgtype.Int4{Int32: 2, Valid: true}, false},
		{"observer", false, pgtype.Int4{}, false},
	} {
		w, mode, err := ln.Join(context.Background(), "n", tc.group, tc.rank)
		if err != nil || mode != Polling {
			t.Fatalf("%s: mode %d, error %v", tc.what, mode, err)
		}
		if w.Polls() != tc.lazy || w.RankParam() != tc.rank.Int32 || w.Param().String != "w/1" {
			t.Fatalf("%s: polls %v, rank %d, id %q", tc.what, w.Polls(), w.RankParam(), w.Param().String)
		}
	}
	var none *Waiter
	if none.Param().Valid || none.Polls() || none.RankParam() != 0 {
		t.Fatal("no waiter must look behind every waiter")
	}

	w, _, _ := ln.Join(context.Background(), "n", false, pgtype.Int4{Valid: true})
	if d := w.AtHead(time.Hour, 2, false); d != backoff.QueuePoll(time.Hour, 2, time.Second) {
		t.Fatalf("polling third in the queue: %s", d)
	}
	if d := w.AtHead(time.Hour, 2, true); d != time.Hour {
		t.Fatalf("through a failover grace: %s, want the hour it lasts", d)
	}
	w.wake <- struct{}{}
	if err := w.Wait(context.Background(), time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	closeClient()
	if err := w.Wait(context.Background(), time.Hour, nil); !errors.Is(err, pgbaton.ErrClosed) {
		t.Fatalf("after the client closed: %v", err)
	}
}

// A group waiter looks again at the first expiry of another owner's item,
// a TTL at most, or when a failover grace ends.
func TestGroupWait(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	for _, c := range []struct {
		next db.LeaseGroupNextExpiryRow
		want time.Duration
	}{
		{db.LeaseGroupNextExpiryRow{DbNow: now}, 15 * time.Second},
		{db.LeaseGroupNextExpiryRow{DbNow: now, NextExpiry: at(2 * time.Second)}, 2 * time.Second},
		{db.LeaseGroupNextExpiryRow{DbNow: now, NextExpiry: at(time.Minute)}, 15 * time.Second},
		{db.LeaseGroupNextExpiryRow{DbNow: now, NextExpiry: at(time.Second), GraceUntil: at(time.Minute)}, time.Minute},
	} {
		if got := GroupWait(c.next, 15*time.Second); got != c.want {
			t.Errorf("GroupWait(%+v) = %s, want %s", c.next, got, c.want)
		}
	}
}
