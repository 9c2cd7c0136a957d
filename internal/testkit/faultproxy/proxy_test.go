package faultproxy

import (
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func TestForwardStallResumeCut(t *testing.T) {
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
	roundTrip := func(msg string, timeout time.Duration) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(c, buf)
		if err == nil && string(buf) != msg {
			t.Fatalf("echo %q, want %q", buf, msg)
		}
		return err
	}
	if err := roundTrip("hello", 5*time.Second); err != nil {
		t.Fatalf("forward: %v", err)
	}
	p.Stall()
	err = roundTrip("stalled", 200*time.Millisecond)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("stalled round trip: got %v, want a timeout (silence, not a close)", err)
	}
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len("stalled"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "stalled" {
		t.Fatalf("after resume: %q, %v", buf, err)
	}
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("read after Cut succeeded")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("read after Cut timed out; want a reset or EOF")
	}
}
