package hacluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// watchdogScript runs beside the cluster. Its stdin is a pipe whose write
// end only the starting process holds. At EOF, that is when the starting
// process has ended or called Stop, it stops and kills every process whose
// command line contains $HACLUSTER_TOKEN, until none is left, and removes
// $HACLUSTER_DIR. The token is passed in the environment, not as an
// argument, so that the watchdog does not match itself.
const watchdogScript = `cat >/dev/null
tok=$HACLUSTER_TOKEN
sweep() {
  found=
  for f in /proc/[0-9]*/cmdline; do
    p=${f#/proc/}; p=${p%/cmdline}
    [ "$p" = "$$" ] && continue
    c=$(tr '\0' ' ' < "$f" 2>/dev/null) || continue
    case "$c" in *"$tok"*) kill -STOP "$p" 2>/dev/null; found="$found $p";; esac
  done
  [ -n "$found" ] && kill -KILL $found 2>/dev/null
  [ -n "$found" ]
}
i=0
while sweep && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
rm -rf -- "$HACLUSTER_DIR"
`

func (c *Cluster) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("hacluster: watchdog pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "hacluster-watchdog")
	cmd.Env = append(os.Environ(), "HACLUSTER_TOKEN="+c.token, "HACLUSTER_DIR="+c.dir)
	cmd.Stdin = r
	// Own process group: a Ctrl-C aimed at `go test` must not kill the
	// watchdog before it has cleaned up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("hacluster: start watchdog: %w", err)
	}
	c.watchdog, c.wdPipe = cmd, w
	return nil
}

// proc is a process as /proc shows it.
type proc struct {
	PID, PPID int
	State     byte
	Cmdline   string
}

func (p proc) String() string { return fmt.Sprintf("pid %d (%s)", p.PID, p.Cmdline) }

// processes lists the live processes (zombies excluded), except this one.
func processes() []proc {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			continue
		}
		fields := strings.Fields(string(stat[i+2:]))
		if len(fields) < 2 || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, proc{PID: pid, PPID: ppid, State: fields[0][0],
			Cmdline: strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))})
	}
	return out
}

// matching lists the live processes whose command line contains token.
func matching(token string) []proc {
	var out []proc
	for _, p := range processes() {
		if strings.Contains(p.Cmdline, token) {
			out = append(out, p)
		}
	}
	return out
}

// children lists the live processes whose parent is pid.
func children(pid int) []int {
	var out []int
	for _, p := range processes() {
		if p.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out
}

// killAll freezes every pid first, so that none can react to the others'
// deaths (a postmaster restarting children, Patroni restarting its
// postmaster), then kills them all: to the rest of the world they die at
// the same instant, as on a machine that loses power.
func killAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// waitGone waits until none of pids is alive (zombies count as gone).
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		alive := map[int]bool{}
		for _, p := range processes() {
			alive[p.PID] = true
		}
		left := slices.DeleteFunc(slices.Clone(pids), func(pid int) bool { return !alive[pid] })
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hacluster: processes %v still alive after SIGKILL", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sweep kills every process of the cluster until none is left.
func (c *Cluster) sweep(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left := matching(c.token)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hacluster: processes left after %s: %v", timeout, left)
		}
		pids := make([]int, len(left))
		for i, p := range left {
			pids[i] = p.PID
		}
		killAll(pids)
		_ = waitGone(pids, time.Second)
	}
}
