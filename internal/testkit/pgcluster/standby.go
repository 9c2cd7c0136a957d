package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// StartStandby creates a streaming-replication standby of primary and
// starts it. The caller must call Stop. pg_is_in_recovery() is true on it;
// it accepts only reads.
//
// It needs no client tools (pg_basebackup), which a server-only install
// lacks: the base backup is a copy of the primary's data directory taken
// between pg_backup_start and pg_backup_stop (pg_start_backup and
// pg_stop_backup before PostgreSQL 15), which the standby completes by
// streaming the WAL from the backup's start on. A temporary replication
// slot keeps that WAL on the primary until the standby is up; nothing is
// left on the primary afterwards.
func StartStandby(ctx context.Context, primary *Cluster, cfg Config) (*Cluster, error) {
	if cfg.BinDir == "" {
		cfg.BinDir = primary.binDir
	}
	var hold *pgx.Conn
	var slot string
	defer func() {
		if hold != nil {
			// The standby streams from its own position once up. Dropped
			// now rather than when the session ends: the primary is as it
			// was by the time the caller has the standby.
			_, _ = hold.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot)
			hold.Close(context.Background())
		}
	}()
	return start(ctx, cfg, func(c *Cluster) (err error) {
		hold, slot, err = c.baseBackup(ctx, primary)
		return err
	})
}

// baseBackup copies primary's data directory into c's as a standby of it.
// The returned connection holds the temporary slot (named slot) that
// keeps the WAL the standby needs; the caller drops it once the standby
// is up.
func (c *Cluster) baseBackup(ctx context.Context, primary *Cluster) (_ *pgx.Conn, slot string, err error) {
	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		return nil, "", fmt.Errorf("pgcluster: base backup: connect to primary: %w", err)
	}
	defer func() {
		if err != nil {
			conn.Close(context.Background()) // ends the backup, drops the slot
		}
	}()
	slot = "pgcluster_" + strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, filepath.Base(c.dir))
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return nil, "", fmt.Errorf("pgcluster: base backup: %w", err)
	}
	// Non-exclusive backup mode, started and stopped in this session.
	startSQL, stopSQL := "SELECT pg_backup_start($1, true)", "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
	if version < 150000 {
		startSQL, stopSQL = "SELECT pg_start_backup($1, true, false)", "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)"
	}
	// Reserved before the backup starts, so from a point no later than the
	// backup's checkpoint: the standby can stream everything after it.
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true, true)", slot); err != nil {
		return nil, "", fmt.Errorf("pgcluster: base backup: create slot: %w", err)
	}
	if _, err := conn.Exec(ctx, startSQL, "pgcluster standby"); err != nil {
		return nil, "", fmt.Errorf("pgcluster: base backup: start: %w", err)
	}
	copyErr := c.copyDataDir(primary.dataDir)
	var label, spcmap string
	if err := conn.QueryRow(ctx, stopSQL).Scan(&label, &spcmap); err != nil {
		return nil, "", fmt.Errorf("pgcluster: base backup: stop: %w", err)
	}
	if copyErr != nil {
		return nil, "", copyErr
	}
	conf := fmt.Sprintf("\n# pgcluster standby\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres sslmode=disable'\n", primary.port)
	for _, f := range []struct {
		name, text string
		append     bool
	}{
		{"backup_label", label, false},
		{"tablespace_map", spcmap, false},
		{"standby.signal", "", false},
		{"postgresql.auto.conf", conf, true},
	} {
		if f.name == "tablespace_map" && f.text == "" {
			continue
		}
		if err := c.writeDataFile(f.name, f.text, f.append); err != nil {
			return nil, "", err
		}
	}
	return conn, slot, nil
}

// backupSkip lists what a base backup leaves out (as pg_basebackup does):
// files of the running server, and directories copied empty.
var (
	backupSkipFiles = map[string]bool{
		"postmaster.pid": true, "postmaster.opts": true, "backup_label": true, "tablespace_map": true,
		"current_logfiles": true, "standby.signal": true, "recovery.signal": true, "postgresql.auto.conf.tmp": true,
	}
	backupEmptyDirs = map[string]bool{
		"pg_wal": true, "pg_replslot": true, "pg_dynshmem": true, "pg_notify": true, "pg_serial": true,
		"pg_snapshots": true, "pg_stat_tmp": true, "pg_subtrans": true,
	}
)

// copyDataDir copies src, a running server's data directory, into c's.
// Files may change, appear or vanish meanwhile: the WAL replayed from the
// backup's start repairs what was copied mid-write (full-page writes are
// forced during a backup), and what vanished is not missed.
func (c *Cluster) copyDataDir(src string) error {
	const control = "global/pg_control"
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		base := d.Name()
		switch {
		case rel == control: // last, below
			return nil
		case filepath.Dir(rel) == "." && backupSkipFiles[rel],
			strings.HasPrefix(base, "pgsql_tmp"), base == "pg_internal.init":
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		dst := filepath.Join(c.dataDir, rel)
		if d.Type()&fs.ModeSymlink != 0 { // pg_tblspc entries
			target, err := os.Readlink(path)
			if err != nil {
				return ignoreVanished(err)
			}
			return c.own(dst, os.Symlink(target, dst))
		}
		info, err := d.Info()
		if err != nil {
			return ignoreVanished(err)
		}
		if d.IsDir() {
			if err := c.own(dst, os.Mkdir(dst, info.Mode().Perm())); err != nil {
				return err
			}
			if !backupEmptyDirs[rel] {
				return nil
			}
			// Without their files, but pg_wal keeps its folders
			// (archive_status, and summaries from 17 on).
			if rel == "pg_wal" {
				entries, err := os.ReadDir(path)
				if err != nil {
					return err
				}
				for _, e := range entries {
					if e.IsDir() {
						sub := filepath.Join(dst, e.Name())
						if err := c.own(sub, os.Mkdir(sub, info.Mode().Perm())); err != nil {
							return err
						}
					}
				}
			}
			return fs.SkipDir
		}
		return c.copyFile(path, dst, info.Mode().Perm())
	})
	if err == nil {
		err = c.copyFile(filepath.Join(src, control), filepath.Join(c.dataDir, control), 0o600)
	}
	if err != nil {
		return fmt.Errorf("pgcluster: base backup: copy data directory: %w", err)
	}
	return nil
}

func ignoreVanished(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (c *Cluster) copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return ignoreVanished(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return c.own(dst, err)
}

func (c *Cluster) writeDataFile(name, text string, appendTo bool) error {
	flag := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flag = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	path := filepath.Join(c.dataDir, name)
	f, err := os.OpenFile(path, flag, 0o600)
	if err == nil {
		_, err = io.WriteString(f, text)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err = c.own(path, err); err != nil {
		return fmt.Errorf("pgcluster: base backup: write %s: %w", name, err)
	}
	return nil
}

// own hands path, just created (err nil), to the user the server runs as.
func (c *Cluster) own(path string, err error) error {
	if err != nil || c.cred == nil {
		return err
	}
	return os.Lchown(path, int(c.cred.Uid), int(c.cred.Gid))
}
