package faultproxy

import (
	"io"
	"net"
	"testing"
	"time"
)

func TestLatencySlowsEveryRoundTrip(t *testing.T) {
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func() time.Duration {
		start := time.Now()
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	const delay = 100 * time.Millisecond
	p.SetLatency(delay)
	if got := roundTrip(); got < 2*delay { // one delay each way
		t.Fatalf("round trip with latency %s took %s, want >= %s", delay, got, 2*delay)
	}
	p.SetLatency(0)
	if got := roundTrip(); got >= 2*delay {
		t.Fatalf("round trip after latency off took %s", got)
	}
}
