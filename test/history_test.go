package test

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Operation kinds and outcome types of a history, as in Jepsen: every
// operation is an invoke followed by ok, fail (certainly had no effect) or
// unknown (may or may not have had an effect); a process that dies leaves
// its last invoke open, which counts as unknown.
const (
	opAcquire = "acquire"
	opWrite   = "write"
	opRelease = "release"

	evInvoke  = "invoke"
	evOK      = "ok"
	evFail    = "fail"
	evUnknown = "unknown"
)

// event is one line of a worker's history, printed as JSON on its stdout.
type event struct {
	Proc  int    `json:"p"`    // worker process incarnation, unique per run
	Key   string `json:"k"`    // lease name
	Op    string `json:"op"`   // acquire, write, release
	Type  string `json:"type"` // invoke, ok, fail, unknown
	Mono  int64  `json:"t"`    // CLOCK_MONOTONIC nanoseconds, see monoNow
	Token int64  `json:"tok,omitempty"`
	OpID  string `json:"id,omitempty"` // a write's id, stored in the ledger
	Err   string `json:"err,omitempty"`
}

// monoNow is the host's CLOCK_MONOTONIC in nanoseconds. Unlike the wall
// clock it never steps, and unlike Go's monotonic readings (relative to each
// process's start) it is one clock for every process on the host: the
// parent and all workers stamp their events on the same time line. The
// suite runs every worker on the host of the parent, so that holds.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot fail on Linux
	}
	return ts.Nano()
}

// emitter prints events from a worker; one line per event, written whole.
type emitter struct {
	mu   sync.Mutex
	proc int
}

func (e *emitter) emit(ev event) {
	ev.Proc = e.proc
	if ev.Mono == 0 {
		ev.Mono = monoNow()
	}
	b, _ := json.Marshal(ev)
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(os.Stdout, "%s\n", b)
}

// history collects the events of all workers in the parent.
type history struct {
	mu     sync.Mutex
	events []event
	// holding is the live view the nemesis aims with: proc -> key it holds.
	holding map[int]string
}

func newHistory() *history { return &history{holding: map[int]string{}} }

func (h *history) add(ev event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
	switch {
	case ev.Op == opAcquire && ev.Type == evOK:
		h.holding[ev.Proc] = ev.Key
	case ev.Op == opRelease && ev.Type == evInvoke:
		delete(h.holding, ev.Proc)
	}
}

func (h *history) forget(proc int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.holding, proc)
}

// holders returns the procs holding a lease now, with their keys.
func (h *history) holders() map[int]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[int]string, len(h.holding))
	for p, k := range h.holding {
		m[p] = k
	}
	return m
}

func (h *history) snapshot() []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]event(nil), h.events...)
}
