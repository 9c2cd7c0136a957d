package backoff

import (
	"context"
	"testing"
	"time"
)

func TestBackoffGrowsCapsAndResets(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for i, w := range want {
		w *= time.Millisecond
		if d := b.Next(); d < w*3/4 || d > w*5/4 {
			t.Fatalf("try %d: %s, want %s ±25%%", i, d, w)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond*5/4 {
		t.Fatalf("after Reset: %s", d)
	}
}

func TestJitterSpreads(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		d := Jitter(time.Second)
		if d < 750*time.Millisecond || d > 1250*time.Millisecond {
			t.Fatalf("%s outside [0.75s, 1.25s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Fatalf("only %d distinct delays in 100", len(seen))
	}
	if Jitter(0) != 0 || Jitter(-time.Second) != 0 {
		t.Fatal("no delay must stay no delay")
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep said the context ended")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep ignored an ended context")
	}
}

func TestQueuePollPacesByPlace(t *testing.T) {
	if d := headPoll(time.Millisecond); d != 5*time.Millisecond {
		t.Fatalf("headPoll(1ms) = %s, want the 5ms floor", d)
	}
	if d := headPoll(time.Minute); d != 50*time.Millisecond {
		t.Fatalf("headPoll(1m) = %s, want the 50ms cap", d)
	}
	if d := QueuePoll(time.Second, 2, 100*time.Millisecond); d != 150*time.Millisecond {
		t.Fatalf("third in the queue: %s, want 3×50ms", d)
	}
	if d := QueuePoll(10*time.Millisecond, 2, 100*time.Millisecond); d != 10*time.Millisecond {
		t.Fatalf("%s, want the holder's expiry first", d)
	}
}

func TestWaitForCapsWhenPolling(t *testing.T) {
	for range 100 {
		if d := WaitFor(time.Hour, true, 100*time.Millisecond, time.Second); d < 101*time.Millisecond || d > 111*time.Millisecond {
			t.Fatalf("polling: %s, want 100ms plus 1-11ms", d)
		}
		if d := WaitFor(-time.Second, false, 0, time.Hour); d < time.Millisecond || d > 21*time.Millisecond {
			t.Fatalf("past expiry: %s, want jitter alone, 1-21ms", d)
		}
	}
}
