package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// watchdogCmd is the hidden command pgbaton exec starts itself as: the
// parent of the user's command, in a process of its own so that whatever
// freezes or kills pgbaton exec does not stop it from killing the command
// in time.
const watchdogCmd = "exec-watchdog"

// newWatchdogCmd: fd 3 brings deadlines ("deadline NS", an instant of
// processClock, 0 for none) from pgbaton exec; fd 4 takes back the
// command's pid ("pid N") and, if it had to, why it killed the command
// ("killed deadline" or "killed orphaned"). Its exit code is the
// command's (128+N for a signal N).
func newWatchdogCmd() *cobra.Command {
	var killGrace time.Duration
	cmd := &cobra.Command{
		Use:    watchdogCmd + " -- COMMAND [ARG...]",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := watch(os.NewFile(3, "deadlines"), os.NewFile(4, "status"), killGrace, args)
			if err != nil {
				return err
			}
			return exitCodeError{code: code}
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().DurationVar(&killGrace, "kill-grace", time.Second, "between SIGTERM and SIGKILL")
	return cmd
}

func watch(deadlines, status *os.File, killGrace time.Duration, args []string) (int, error) {
	defer status.Close()
	// Not the command's to inherit: a daemon it leaves behind would keep
	// pgbaton exec waiting for the end of the status pipe.
	syscall.CloseOnExec(int(deadlines.Fd()))
	syscall.CloseOnExec(int(status.Fd()))
	// The first deadline was written before this process started.
	in := bufio.NewScanner(deadlines)
	deadline := readDeadline(in)
	c := exec.Command(args[0], args[1:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		return 127, fmt.Errorf("exec: %w", err)
	}
	pgid := c.Process.Pid
	fmt.Fprintf(status, "pid %d\n", pgid)

	news := make(chan int64)
	go func() {
		defer close(news) // pgbaton exec is gone: nobody renews the lock
		for {
			d := readDeadline(in)
			if d < 0 {
				return
			}
			news <- d
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	termed := false
	killed := ""
	arm := func() {
		if deadline == 0 {
			timer.Reset(time.Hour)
			return
		}
		at := deadline - int64(killGrace) // SIGTERM first
		if termed {
			at = deadline
		}
		timer.Reset(time.Duration(at - processClock()))
	}
	arm()
	for {
		select {
		case d, ok := <-news:
			if !ok {
				news = nil
				if deadline == 0 || deadline > processClock()+int64(killGrace) {
					deadline = processClock() + int64(killGrace)
				}
				if killed == "" {
					killed = "orphaned"
				}
			} else if !termed {
				deadline = d
			}
			arm()
		case <-timer.C:
			if deadline == 0 {
				arm()
				continue
			}
			if killed == "" {
				killed = "deadline"
			}
			if !termed {
				termed = true
				_ = syscall.Kill(-pgid, syscall.SIGTERM)
				arm()
				continue
			}
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			timer.Reset(time.Hour)
		case err := <-exited:
			if killed != "" {
				// The group may outlive its leader: make sure of it.
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				fmt.Fprintf(status, "killed %s\n", killed)
			}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal()), nil
				}
				return ee.ExitCode(), nil
			}
			return 0, err
		}
	}
}

// readDeadline reads the next "deadline NS"; -1 at the end.
func readDeadline(in *bufio.Scanner) int64 {
	for in.Scan() {
		if v, ok := strings.CutPrefix(in.Text(), "deadline "); ok {
			if d, err := strconv.ParseInt(v, 10, 64); err == nil {
				return d
			}
		}
	}
	return -1
}
