package hacluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
)

// ErrMissingPackages is returned by Start when patroni, patronictl or etcd
// is not installed.
var ErrMissingPackages = errors.New("hacluster: Patroni and etcd are not installed")

// Requirements is the apt-get command that installs what a cluster needs
// on Debian and Ubuntu (besides the PostgreSQL server).
const Requirements = "apt-get install -y patroni etcd-server etcd-client"

// Config configures Start. The zero value is a two-node cluster with
// timings fit for tests.
type Config struct {
	// Nodes is the number of Patroni nodes. Default 2.
	Nodes int
	// BinDir holds the PostgreSQL server binaries. Default: found by
	// pgcluster.FindBinDir.
	BinDir string
	// TTL is Patroni's leader key TTL in seconds: a leader that stops
	// renewing its key loses it after this long, and a replica takes over
	// at its next loop. Default 5 (Patroni's default is 30).
	TTL int
	// LoopWait is Patroni's loop period in seconds. Default 1.
	LoopWait int
	// RetryTimeout is Patroni's timeout for DCS and PostgreSQL operations,
	// in seconds. Default 2. LoopWait + 2*RetryTimeout must not exceed TTL.
	RetryTimeout int
	// Parameters are extra PostgreSQL settings for every node.
	Parameters map[string]string
	// StartTimeout bounds Start. Default 3 minutes.
	StartTimeout time.Duration
	// Logger receives progress messages. Default: none.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Nodes <= 0 {
		c.Nodes = 2
	}
	if c.TTL <= 0 {
		c.TTL = 5
	}
	if c.LoopWait <= 0 {
		c.LoopWait = 1
	}
	if c.RetryTimeout <= 0 {
		c.RetryTimeout = 2
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 3 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Node is one Patroni node with its PostgreSQL.
type Node struct {
	Name    string
	Port    int // PostgreSQL, what clients connect to
	APIPort int // Patroni's REST API
	dir     string
	proxy   *faultproxy.Proxy // in front of Port, for replication

	mu     sync.Mutex
	cmd    *exec.Cmd // Patroni, nil when not running
	exited chan struct{}
}

// DataDir is the node's PostgreSQL data directory.
func (n *Node) DataDir() string { return filepath.Join(n.dir, "data") }

// Cluster is a running Patroni cluster.
type Cluster struct {
	cfg      Config
	binDir   string
	dir      string
	token    string // unique; in every process's command line
	cred     *syscall.Credential
	etcdPort int
	etcd     *exec.Cmd
	nodes    []*Node

	watchdog *exec.Cmd
	wdPipe   *os.File

	mu      sync.Mutex
	stopped bool
}

// Start starts etcd and cfg.Nodes Patroni nodes and waits until one is the
// leader and every other one replicates from it. The caller must call Stop.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	cfg = cfg.withDefaults()
	for _, bin := range []string{"patroni", "patronictl", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%w: %s not found on PATH; install them with: %s", ErrMissingPackages, bin, Requirements)
		}
	}
	binDir := cfg.BinDir
	if binDir == "" {
		if binDir, err = pgcluster.FindBinDir(); err != nil {
			return nil, err
		}
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = pgcluster.Unprivileged(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "pgbaton-ha-")
	if err != nil {
		return nil, fmt.Errorf("hacluster: create temp dir: %w", err)
	}
	c := &Cluster{cfg: cfg, binDir: binDir, dir: dir, token: filepath.Base(dir), cred: cred}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	if err := c.startWatchdog(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		n, err := c.newNode(fmt.Sprintf("n%d", i+1))
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := c.writeConfig(n); err != nil {
			return nil, err
		}
	}
	if err := c.chown(); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if err := c.startPatroni(n); err != nil {
			return nil, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := c.WaitHealthy(wctx, false); err != nil {
		return nil, err
	}
	cfg.Logger.Info("patroni cluster up", "dir", dir, "nodes", len(c.nodes))
	return c, nil
}

func (c *Cluster) chown() error {
	if c.cred == nil {
		return nil
	}
	return filepath.Walk(c.dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(c.cred.Uid), int(c.cred.Gid))
	})
}

// command prepares a long-running process of the cluster: its own process
// group, the unprivileged user when root, output appended to logName in
// the cluster's directory.
func (c *Cluster) command(logName, name string, args ...string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(filepath.Join(c.dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("hacluster: open log: %w", err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + c.dir, "LANG=C.UTF-8", "LC_ALL=C.UTF-8"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	var err error
	if c.etcdPort, err = pgcluster.FreePort(); err != nil {
		return err
	}
	peer, err := pgcluster.FreePort()
	if err != nil {
		return err
	}
	dataDir := filepath.Join(c.dir, "etcd")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		return fmt.Errorf("hacluster: %w", err)
	}
	if err := c.chown(); err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	cmd, err := c.command("etcd.log", "etcd", "--name", "etcd", "--data-dir", dataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcd="+peerURL, "--initial-cluster-state", "new")
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("hacluster: start etcd: %w", err)
	}
	c.etcd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	for {
		var health struct{ Health string }
		if err := getJSON(ctx, client+"/health", &health); err == nil && health.Health == "true" {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("hacluster: etcd exited during start-up:\n%s", c.logTail("etcd.log"))
		case <-ctx.Done():
			return fmt.Errorf("hacluster: etcd did not come up: %w\n%s", ctx.Err(), c.logTail("etcd.log"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) newNode(name string) (*Node, error) {
	n := &Node{Name: name, dir: filepath.Join(c.dir, name)}
	var err error
	if n.Port, err = pgcluster.FreePort(); err != nil {
		return nil, err
	}
	if n.APIPort, err = pgcluster.FreePort(); err != nil {
		return nil, err
	}
	if n.proxy, err = faultproxy.New(fmt.Sprintf("127.0.0.1:%d", n.Port)); err != nil {
		return nil, fmt.Errorf("hacluster: replication proxy: %w", err)
	}
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		return nil, fmt.Errorf("hacluster: %w", err)
	}
	return n, nil
}

// writeConfig writes the node's Patroni configuration (JSON is YAML).
func (c *Cluster) writeConfig(n *Node) error {
	params := map[string]string{
		"wal_log_hints":   "on", // pg_rewind lets a failed leader rejoin
		"max_connections": "200",
		"shared_buffers":  "32MB",
		"max_wal_senders": "10",
		// Dynamic shared memory in files under the data directory, so that
		// nothing is left in /dev/shm after a SIGKILL.
		"dynamic_shared_memory_type": "mmap",
	}
	for k, v := range c.cfg.Parameters {
		params[k] = v
	}
	hba := []string{
		"local all all trust", "local replication all trust",
		"host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust",
	}
	auth := map[string]string{"username": "postgres", "password": "pgbaton"}
	conf := map[string]any{
		"scope": c.token, // PostgreSQL's cluster_name: in every backend's title
		"name":  n.Name,
		"restapi": map[string]any{
			"listen":          fmt.Sprintf("127.0.0.1:%d", n.APIPort),
			"connect_address": fmt.Sprintf("127.0.0.1:%d", n.APIPort),
		},
		"etcd3": map[string]any{"hosts": fmt.Sprintf("127.0.0.1:%d", c.etcdPort)},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": c.cfg.TTL, "loop_wait": c.cfg.LoopWait, "retry_timeout": c.cfg.RetryTimeout,
				"maximum_lag_on_failover": 1 << 20,
				"postgresql": map[string]any{
					"use_pg_rewind": true, "use_slots": true, "parameters": params,
				},
			},
			"initdb":    []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"}, "no-sync"},
			"pg_hba":    hba,
			"users":     map[string]any{},
			"post_init": "",
		},
		"postgresql": map[string]any{
			"listen": fmt.Sprintf("127.0.0.1:%d", n.Port),
			// Replicas stream from the leader through its proxy.
			"connect_address": n.proxy.Addr(),
			"data_dir":        n.DataDir(),
			"bin_dir":         c.binDir,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"authentication":  map[string]any{"superuser": auth, "replication": auth, "rewind": auth},
			"parameters": map[string]string{
				"unix_socket_directories": n.dir,
				"logging_collector":       "off",
				"log_min_messages":        "warning",
			},
			"pg_hba": hba,
		},
		"tags": map[string]any{},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(c.configPath(n), b, 0o644)
}

func (c *Cluster) configPath(n *Node) string { return filepath.Join(c.dir, n.Name+".yml") }

func (c *Cluster) startPatroni(n *Node) error {
	cmd, err := c.command(n.Name+".log", "patroni", c.configPath(n))
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("hacluster: start patroni %s: %w", n.Name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	return nil
}

// Nodes returns the cluster's nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// URL is the connection URL a client of the cluster uses: every node, and
// target_session_attrs=read-write so that it connects to the leader.
func (c *Cluster) URL(db string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), db)
}

// NodeURL is a connection URL for one node only.
func (c *Cluster) NodeURL(name, db string) string {
	n := c.Node(name)
	if n == nil {
		return ""
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.Port, db)
}

// Dir is the cluster's temporary directory (configuration, data, logs).
func (c *Cluster) Dir() string { return c.dir }

func (c *Cluster) logTail(name string) string {
	b, err := os.ReadFile(filepath.Join(c.dir, name))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	return strings.Join(lines, "\n")
}

// LogTail returns the last lines of node's Patroni and PostgreSQL log.
func (c *Cluster) LogTail(node string) string { return c.logTail(node + ".log") }

// Leftovers lists the processes of the cluster still running: none after
// Stop.
func (c *Cluster) Leftovers() []string {
	var out []string
	for _, p := range matching(c.token) {
		out = append(out, p.String())
	}
	return out
}

// Stop kills every process of the cluster and removes its directory. It
// is safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	err := c.sweep(30 * time.Second)
	for _, n := range c.nodes {
		_ = n.proxy.Close()
	}
	if c.wdPipe != nil {
		_ = c.wdPipe.Close()
		_ = c.watchdog.Wait()
	}
	if rmErr := os.RemoveAll(c.dir); rmErr != nil && err == nil {
		err = fmt.Errorf("hacluster: remove %s: %w", c.dir, rmErr)
	}
	c.cfg.Logger.Info("patroni cluster stopped", "dir", c.dir)
	return err
}

// postmaster returns the pid of node's running postmaster, or 0.
func (n *Node) postmaster() int {
	b, err := os.ReadFile(filepath.Join(n.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// getJSON GETs url and decodes the JSON answer into v.
func getJSON(ctx context.Context, url string, v any) error {
	return doJSON(ctx, "GET", url, nil, v)
}
