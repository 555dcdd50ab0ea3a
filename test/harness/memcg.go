package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memoryCgroup is a memory cgroup that holds one daemon of the simulation under a hard limit, as the chart's
// resources.limits.memory holds it in its container: past the limit the kernel reclaims, then kills it.
type memoryCgroup struct {
	dir string
	v2  bool
}

// cgroupRoot is where the memory controller is mounted: cgroup v1's own hierarchy, or the unified one.
func cgroupRoot() (dir string, v2 bool, err error) {
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		return "/sys/fs/cgroup/memory", false, nil
	}
	if data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(data), "memory") {
		return "/sys/fs/cgroup", true, nil
	}
	return "", false, errors.New("no memory cgroup controller writable here")
}

// newMemoryCgroup creates the cgroup name with a hard limit of limit bytes.
func newMemoryCgroup(name string, limit int64) (*memoryCgroup, error) {
	root, v2, err := cgroupRoot()
	if err != nil {
		return nil, err
	}
	cg := &memoryCgroup{dir: filepath.Join(root, name), v2: v2}
	if err := os.Mkdir(cg.dir, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("creating memory cgroup %s: %w", cg.dir, err)
	}
	file := "memory.limit_in_bytes"
	if v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(cg.dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		cg.remove()
		return nil, fmt.Errorf("limiting memory cgroup %s: %w", cg.dir, err)
	}
	return cg, nil
}

// launcher is the command that starts binary inside the cgroup, so it reads its limit from its first
// instruction (the daemons size their soft memory limit from it at start): a shell that joins the cgroup and
// then becomes the binary.
func (cg *memoryCgroup) launcher(binary string, args []string) (string, []string) {
	return "/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(cg.dir, "cgroup.procs"), binary}, args...)
}

// OOMKills counts the processes the kernel killed in the cgroup for want of memory.
func (cg *memoryCgroup) OOMKills() (int, error) {
	data, err := cg.read("memory.oom_control", "memory.events")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(data, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill count", cg.dir)
}

// PeakBytes is the most memory the cgroup's processes held at once.
func (cg *memoryCgroup) PeakBytes() (int64, error) {
	data, err := cg.read("memory.max_usage_in_bytes", "memory.peak")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(data), 10, 64)
}

// read reads the cgroup's file of that name under cgroup v1, or under v2.
func (cg *memoryCgroup) read(v1, v2 string) (string, error) {
	file := v1
	if cg.v2 {
		file = v2
	}
	data, err := os.ReadFile(filepath.Join(cg.dir, file))
	return string(data), err
}

// remove deletes the cgroup once its processes are gone.
func (cg *memoryCgroup) remove() { _ = os.Remove(cg.dir) }
