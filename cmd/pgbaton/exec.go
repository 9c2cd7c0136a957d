package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Exit codes of pgbaton exec besides the command's own.
const (
	exitNotAcquired = 75 // --skip, and the lock is held elsewhere (EX_TEMPFAIL: try the next slot)
	exitLost        = 76 // the lock was lost while the command ran, and the command was killed
)

// exitCodeError ends the CLI with code; err, when not nil, is printed.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string {
	if e.err == nil {
		return "exit " + strconv.Itoa(e.code)
	}
	return e.err.Error()
}

func (e exitCodeError) Unwrap() error { return e.err }

type execOpts struct {
	lease     string
	wait      bool
	skip      bool
	slots     int
	advisory  bool
	namespace string
	ttl       time.Duration
	killGrace time.Duration
	owner     string
}

func newExecCmd(g *globals) *cobra.Command {
	var o execOpts
	cmd := &cobra.Command{
		Use:   "exec --lease NAME [--wait | --skip] [-n N] [--advisory] -- COMMAND [ARG...]",
		Short: "Run a command only while holding a lease (or an advisory lock)",
		Long: `exec takes the lease NAME (waiting for it, or with --skip giving up at once),
runs COMMAND with PGBATON_LEASE and PGBATON_TOKEN (the fencing token) in its
environment, forwards signals to it, and exits with its exit code.

COMMAND runs in a process group of its own, watched by a small process that
kills that whole group (SIGTERM, then SIGKILL --kill-grace later) by the
lease's local deadline, before the database can grant the lease to anyone
else, unless pgbaton exec renews it in time: even when pgbaton exec itself is
frozen or killed. A lease lost while COMMAND runs stops it the same way.

With -n N the lease is one of N permits of a semaphore named NAME. With
--advisory it is a session advisory lock instead: no token, held as long as
this process's session, lost with it.

Exit codes: COMMAND's own (128+N when a signal N ended it), 75 when --skip
found the lock held, 76 when the lock was lost and COMMAND was killed, 1 and
2 for pgbaton's own errors and usage.`,
		Example: `  # On every host, from cron: one run per slot, the others skip
  */5 * * * * pgbaton exec --lease report --skip -- /usr/local/bin/report

  # Wait for the lease; the command fences its writes with $PGBATON_TOKEN
  pgbaton exec --lease migrate-orders -- ./migrate-orders

  # At most 3 exports at a time across the fleet
  pgbaton exec --lease exports -n 3 -- ./export.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{fmt.Errorf("exec needs a command to run after --")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				return g.exec(cmd.Context(), pool, o, args)
			})
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // flags end at COMMAND: its own flags are its own
	f.StringVar(&o.lease, "lease", "", "lease (or with --advisory, lock) name (required)")
	f.BoolVar(&o.wait, "wait", false, "wait until the lock is free (the default)")
	f.BoolVar(&o.skip, "skip", false, "exit 75 at once if the lock is held")
	f.IntVarP(&o.slots, "slots", "n", 1, "hold one of N permits of a semaphore NAME")
	f.BoolVar(&o.advisory, "advisory", false, "a session advisory lock instead of a lease")
	f.StringVar(&o.namespace, "namespace", "", "advisory lock namespace (advisory.Config.Namespace)")
	f.DurationVar(&o.ttl, "ttl", 15*time.Second, "lease TTL: how long the lease outlives a frozen or dead pgbaton exec")
	f.DurationVar(&o.killGrace, "kill-grace", time.Second, "between SIGTERM and SIGKILL when the command must stop")
	f.StringVar(&o.owner, "owner", "", "owner recorded with the lock (default host:pid)")
	return cmd
}

func (o *execOpts) check() error {
	switch {
	case o.lease == "":
		return usageError{fmt.Errorf("--lease is required")}
	case o.wait && o.skip:
		return usageError{fmt.Errorf("--wait and --skip exclude each other")}
	case o.slots < 1 || o.slots > leasetable.MaxSlots:
		return usageError{fmt.Errorf("-n must be in 1..%d", leasetable.MaxSlots)}
	case o.advisory && o.slots > 1:
		return usageError{fmt.Errorf("-n is for leases; an advisory lock has no permits")}
	case !o.advisory && o.namespace != "":
		return usageError{fmt.Errorf("--namespace is for --advisory")}
	case o.ttl < time.Second:
		return usageError{fmt.Errorf("--ttl must be at least 1s")}
	case o.killGrace < 0 || o.killGrace >= o.ttl/2:
		return usageError{fmt.Errorf("--kill-grace must be in 0..--ttl/2")}
	}
	if o.owner == "" {
		host, _ := os.Hostname()
		o.owner = host + ":" + strconv.Itoa(os.Getpid())
	}
	return nil
}

// held is the lock exec runs the command under.
type held struct {
	env      []string
	lost     <-chan struct{}
	deadline func() time.Time // zero: none (an advisory lock lasts as long as the session)
	release  func(context.Context) error
}

func (g *globals) exec(ctx context.Context, pool *pgxpool.Pool, o execOpts, args []string) error {
	h, closeLock, err := o.take(ctx, pool)
	if err != nil {
		return err
	}
	defer closeLock()
	// Signals belong to the command from here on: forwarded, not ending
	// pgbaton exec before it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	code, lost, err := runWatched(h, o.killGrace, args, sigs)
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = h.release(releaseCtx)
	switch {
	case err != nil:
		return err
	case lost:
		return exitCodeError{exitLost, fmt.Errorf("exec: lock %q lost while the command ran; the command was stopped", o.lease)}
	case code != 0:
		return exitCodeError{code: code}
	}
	return nil
}

// take takes the lock as o says; closeLock closes the client or locker.
func (o execOpts) take(ctx context.Context, pool *pgxpool.Pool) (_ held, closeLock func(), _ error) {
	notAcquired := func(err error) error {
		return exitCodeError{exitNotAcquired, fmt.Errorf("exec: lock %q is held elsewhere; not run (%w)", o.lease, err)}
	}
	closeCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	}
	if o.advisory {
		locker, err := advisory.New(pool, advisory.Config{Owner: o.owner, Namespace: o.namespace})
		if err != nil {
			return held{}, nil, err
		}
		closeLock = func() { c, cancel := closeCtx(); defer cancel(); _ = locker.Close(c) }
		take := locker.Lock
		if o.skip {
			take = locker.TryLock
		}
		lk, err := take(ctx, advisory.Name(o.lease))
		switch {
		case o.skip && errors.Is(err, advisory.ErrLocked):
			closeLock()
			return held{}, nil, notAcquired(err)
		case err != nil:
			closeLock()
			return held{}, nil, err
		}
		return held{env: []string{"PGBATON_LEASE=" + o.lease, "PGBATON_OWNER=" + o.owner}, lost: lk.Done(),
			deadline: func() time.Time { return time.Time{} }, release: lk.Unlock}, closeLock, nil
	}
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: o.owner, TTL: o.ttl})
	if err != nil {
		return held{}, nil, err
	}
	closeLock = func() { c, cancel := closeCtx(); defer cancel(); _ = client.Close(c) }
	var l *leasetable.Lease
	switch {
	case o.slots > 1 && o.skip:
		l, err = client.TrySemaphore(ctx, o.lease, o.slots)
	case o.slots > 1:
		l, err = client.Semaphore(ctx, o.lease, o.slots)
	case o.skip:
		l, err = client.TryAcquire(ctx, o.lease)
	default:
		l, err = client.Acquire(ctx, o.lease)
	}
	switch {
	case o.skip && errors.Is(err, leasetable.ErrHeld):
		closeLock()
		return held{}, nil, notAcquired(err)
	case err != nil:
		closeLock()
		return held{}, nil, err
	}
	return held{
		env:      []string{"PGBATON_LEASE=" + l.Name(), "PGBATON_TOKEN=" + strconv.FormatInt(l.Token(), 10), "PGBATON_OWNER=" + o.owner},
		lost:     l.Done(),
		deadline: l.Deadline,
		release:  l.Release,
	}, closeLock, nil
}

// runWatched runs args under a watchdog process (pgbaton exec-watchdog)
// that owns the command's process group and kills it by the lock's
// deadline, and returns the command's exit code, or lost when the lock
// was lost (by this process's word or the watchdog's) and the command
// stopped for it.
func runWatched(h held, killGrace time.Duration, args []string, sigs <-chan os.Signal) (code int, lost bool, _ error) {
	self, err := os.Executable()
	if err != nil {
		return 0, false, fmt.Errorf("exec: %w", err)
	}
	ctlR, ctlW, err := os.Pipe() // deadlines, to the watchdog
	if err != nil {
		return 0, false, fmt.Errorf("exec: %w", err)
	}
	defer ctlW.Close()
	stR, stW, err := os.Pipe() // the command's pid and the watchdog's verdict, from it
	if err != nil {
		ctlR.Close()
		return 0, false, fmt.Errorf("exec: %w", err)
	}
	w := exec.Command(self, append([]string{watchdogCmd, "--kill-grace", killGrace.String(), "--"}, args...)...)
	w.Stdin, w.Stdout, w.Stderr = os.Stdin, os.Stdout, os.Stderr
	w.Env = append(os.Environ(), h.env...)
	w.ExtraFiles = []*os.File{ctlR, stW}
	// Its own group: a signal to this process's group (a terminal's ^Z)
	// must not freeze the watchdog with it.
	w.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sendDeadline(ctlW, h.deadline()) // before it starts the command
	err = w.Start()
	ctlR.Close()
	stW.Close()
	if err != nil {
		stR.Close()
		return 0, false, fmt.Errorf("exec: start the watchdog: %w", err)
	}
	status := make(chan string, 4)
	go func() {
		defer close(status)
		sc := bufio.NewScanner(stR)
		for sc.Scan() {
			status <- sc.Text()
		}
		stR.Close()
	}()
	exited := make(chan error, 1)
	go func() { exited <- w.Wait() }()

	pgid := 0
	var killedFor string
	tick := time.NewTicker(deadlinePush)
	defer tick.Stop()
	lostCh := h.lost
	for {
		select {
		case line, ok := <-status:
			if !ok {
				status = nil
				continue
			}
			if v, found := strings.CutPrefix(line, "pid "); found {
				pgid, _ = strconv.Atoi(v)
			}
			if v, found := strings.CutPrefix(line, "killed "); found {
				killedFor = v
			}
		case sig := <-sigs:
			if pgid > 0 {
				_ = syscall.Kill(-pgid, sig.(syscall.Signal))
			}
		case <-tick.C:
			sendDeadline(ctlW, h.deadline())
		case <-lostCh:
			// Stop now rather than at the deadline the watchdog keeps.
			lostCh = nil
			sendDeadline(ctlW, time.Now().Add(killGrace))
			if killedFor == "" {
				killedFor = "lost"
			}
		case err := <-exited:
			for status != nil { // the verdict, if it came last
				line, ok := <-status
				if !ok {
					break
				}
				if v, found := strings.CutPrefix(line, "killed "); found {
					killedFor = v
				}
			}
			code := 0
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee):
				code = ee.ExitCode()
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int(ws.Signal())
				}
			case err != nil:
				return 0, false, fmt.Errorf("exec: watchdog: %w", err)
			}
			return code, killedFor != "", nil
		}
	}
}

// deadlinePush is how often the deadline, moved by each keep-alive, is
// sent to the watchdog.
const deadlinePush = 200 * time.Millisecond

// sendDeadline tells the watchdog the lock's deadline, as an instant of
// the system-wide clock (processClock) both processes read: a process
// frozen between reading and sending sends a correct instant late, never a
// late instant. Zero: no deadline.
func sendDeadline(w io.Writer, d time.Time) {
	var at int64
	if !d.IsZero() {
		now := processClock() // first: a pause before time.Now makes the deadline earlier, not later
		at = now + int64(time.Until(d))
	}
	fmt.Fprintf(w, "deadline %d\n", at)
}
