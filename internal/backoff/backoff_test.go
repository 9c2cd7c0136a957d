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
