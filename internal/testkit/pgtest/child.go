package pgtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child is a child process of the test binary running one of the
// Options.Children bodies: a separate OS process for multi-process and
// fault tests.
type Child struct {
	Name string
	Cmd  *exec.Cmd

	lines  chan string
	stderr *strings.Builder
	mu     sync.Mutex
	waited chan struct{}
	err    error
}

// StartChild starts the test binary again as a child process that runs
// Options.Children[name] with args. Its stdout is read line by line (see
// Expect); its stderr is kept for failure messages. The child is killed
// when t ends if it is still running.
func (e *Env) StartChild(t testing.TB, name string, args ...string) *Child {
	t.Helper()
	if _, ok := e.opts.Children[name]; !ok {
		t.Fatalf("pgtest: no child named %q in Options.Children", name)
	}
	enc, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+name, envChildArgs+"="+string(enc))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("pgtest: child stdout: %v", err)
	}
	c := &Child{Name: name, Cmd: cmd, lines: make(chan string, 1024), stderr: &strings.Builder{}, waited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &c.mu, w: c.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgtest: start child %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.waited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.waited:
		default:
			_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped child cannot die otherwise
			_ = cmd.Process.Kill()
			<-c.waited
		}
	})
	return c
}

// Expect waits for the next stdout line that starts with prefix, skipping
// others, and returns the rest of that line. It fails the test when the
// child exits first or timeout passes.
func (c *Child) Expect(t testing.TB, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				<-c.waited
				t.Fatalf("pgtest: child %s exited (%v) before printing %q; stderr:\n%s", c.Name, c.err, prefix, c.Stderr())
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return strings.TrimSpace(rest)
			}
		case <-deadline:
			t.Fatalf("pgtest: child %s printed no %q within %s; stderr:\n%s", c.Name, prefix, timeout, c.Stderr())
		}
	}
}

// Signal sends sig to the child.
func (c *Child) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := c.Cmd.Process.Signal(sig); err != nil {
		// Exited by itself (os.ErrProcessDone): say why.
		t.Fatalf("pgtest: signal child %s: %v; stderr:\n%s", c.Name, err, c.Stderr())
	}
}

// Wait waits for the child to exit, at most timeout, and returns its exit
// error (nil for exit status 0).
func (c *Child) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	go func() {
		for range c.lines { // drain so the reader can reach Wait
		}
	}()
	select {
	case <-c.waited:
		return c.err
	case <-time.After(timeout):
		t.Fatalf("pgtest: child %s still running after %s; stderr:\n%s", c.Name, timeout, c.Stderr())
		return nil
	}
}

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.waited }

// Stderr is what the child wrote to stderr so far.
func (c *Child) Stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Printf writes a line to stdout from a child body, for the parent's Expect.
func Printf(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
}
