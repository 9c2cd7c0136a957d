package hacluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Member is one node as Patroni's REST API (GET /cluster) describes it.
type Member struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, replica, sync_standby
	State    string `json:"state"` // running, stopped, starting, ...
	Port     int    `json:"port"`
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"` // bytes, or "unknown"
}

// Status is the cluster as Patroni sees it.
type Status struct {
	Members []Member `json:"members"`
}

// Leader is the member holding the leader key, if any.
func (s Status) Leader() (Member, bool) {
	for _, m := range s.Members {
		if m.Role == "leader" {
			return m, true
		}
	}
	return Member{}, false
}

func doJSON(ctx context.Context, method, url string, body, v any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("hacluster: %s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(b, v)
}

// api calls Patroni's REST API on the first node that answers.
func (c *Cluster) api(ctx context.Context, method, path string, body, v any) error {
	var errs []error
	for _, n := range c.nodes {
		err := doJSON(ctx, method, fmt.Sprintf("http://127.0.0.1:%d%s", n.APIPort, path), body, v)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Status asks Patroni for the cluster's members.
func (c *Cluster) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.api(ctx, "GET", "/cluster", nil, &s)
	return s, err
}

// WaitHealthy waits until every node runs, one is the leader and every
// other one is a replica on the leader's timeline with no lag (with sync,
// one of them the synchronous standby). It returns the leader's name.
func (c *Cluster) WaitHealthy(ctx context.Context, sync bool) (string, error) {
	var last string
	for {
		s, err := c.Status(ctx)
		if err == nil {
			if leader, ok := healthy(s, len(c.nodes), sync); ok {
				// Patroni 3.0 reports a replica "running" with no lag as
				// soon as its PostgreSQL runs, even before its WAL
				// receiver streams: ask the leader.
				n, serr := c.streaming(ctx, leader)
				if serr == nil && n == len(c.nodes)-1 {
					return leader, nil
				}
				last = fmt.Sprintf("leader %s: %d of %d replicas streaming (%v)", leader, n, len(c.nodes)-1, serr)
			} else {
				b, _ := json.Marshal(s)
				last = string(b)
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("hacluster: cluster not healthy: %w; last status: %s", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// streaming counts the replicas streaming from leader, by its
// pg_stat_replication.
func (c *Cluster) streaming(ctx context.Context, leader string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.NodeURL(leader, "postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").Scan(&n)
	return n, err
}

func healthy(s Status, nodes int, sync bool) (string, bool) {
	leader, ok := s.Leader()
	if !ok || leader.State != "running" || len(s.Members) != nodes {
		return "", false
	}
	syncs := 0
	for _, m := range s.Members {
		if m.Name == leader.Name {
			continue
		}
		lag, isNum := m.Lag.(float64)
		if m.State != "running" || m.Timeline != leader.Timeline || !isNum || lag != 0 {
			return "", false
		}
		if m.Role == "sync_standby" {
			syncs++
		}
	}
	if sync && syncs == 0 {
		return "", false
	}
	return leader.Name, true
}

// SetConfig changes the cluster's dynamic configuration (PATCH /config),
// e.g. {"synchronous_mode": true}.
func (c *Cluster) SetConfig(ctx context.Context, patch map[string]any) error {
	return c.api(ctx, "PATCH", "/config", patch, nil)
}

// Switchover makes candidate the leader with `patronictl switchover`: the
// leader shuts down cleanly and candidate is promoted once it has received
// everything.
func (c *Cluster) Switchover(ctx context.Context, leader, candidate string) error {
	cmd := exec.CommandContext(ctx, "patronictl", "-c", c.configPath(c.nodes[0]), "switchover",
		"--leader", leader, "--candidate", candidate, "--force")
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + c.dir, "LANG=C.UTF-8", "LC_ALL=C.UTF-8"}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Successfully switched over") {
		return fmt.Errorf("hacluster: patronictl switchover: %v\n%s", err, out)
	}
	return nil
}
