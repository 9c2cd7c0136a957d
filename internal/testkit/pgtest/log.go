package pgtest

import (
	"bytes"
	"strings"
	"sync"
)

// Log is a text log that a test reads while other goroutines write to it
// (a logger's output, a protocol trace).
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String is what was written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Count is how often s was written so far.
func (l *Log) Count(s string) int { return strings.Count(l.String(), s) }
