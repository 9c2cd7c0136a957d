//go:build linux

package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// pty is a pseudo-terminal: the CLI gets tty (a real terminal to
// isatty(3)), the test reads what it wrote and types into it through the
// master side.
type pty struct {
	master, tty *os.File
	mu          sync.Mutex
	out         bytes.Buffer
	done        chan struct{}
}

func newPTY(t *testing.T) *pty {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	fd := int(master.Fd())
	require.NoError(t, unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0), "unlockpt")
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	require.NoError(t, err, "ptsname")
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	p := &pty{master: master, tty: tty, done: make(chan struct{})}
	// Drain the master side, or the CLI blocks once the pty's buffer fills.
	go func() {
		defer close(p.done)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return // EIO once the tty side is closed
			}
		}
	}()
	t.Cleanup(func() { p.close(); master.Close() })
	return p
}

// close closes the terminal side and returns everything written to it.
func (p *pty) close() string {
	p.tty.Close()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// typeIn types s at the terminal, as a user at the keyboard.
func (p *pty) typeIn(t *testing.T, s string) {
	t.Helper()
	_, err := io.WriteString(p.master, s)
	require.NoError(t, err)
}
