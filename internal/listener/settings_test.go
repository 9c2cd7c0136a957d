package listener

import (
	"strings"
	"testing"
	"time"
)

func TestSettings(t *testing.T) {
	poll, slots := time.Duration(0), 0
	if p := Settings(&poll, &slots, false, ""); p != "" || poll != time.Second || slots != 16 {
		t.Fatalf("defaults: %q, %s, %d", p, poll, slots)
	}
	for _, c := range []struct {
		poll     time.Duration
		slots    int
		noListen bool
		dsn      string
		want     string
	}{
		{-1, 0, false, "", "PollInterval must be positive, got -1ns"},
		{0, 10001, false, "", "ListenSlots must be 1 to 10000, got 10001"},
		{0, -1, false, "", "ListenSlots must be 1 to 10000, got -1"},
		{0, 0, true, "postgres://h/db", "NoListen and ListenDSN exclude each other"},
		{0, 0, false, "postgres://h/db", ""},
		{0, 0, false, "host=h port=x", "ListenDSN: "},
	} {
		if got := Settings(&c.poll, &c.slots, c.noListen, c.dsn); got != c.want && (c.want == "" || !strings.HasPrefix(got, c.want)) {
			t.Errorf("Settings(%s, %d, %t, %q) = %q, want %q", c.poll, c.slots, c.noListen, c.dsn, got, c.want)
		}
	}
}
