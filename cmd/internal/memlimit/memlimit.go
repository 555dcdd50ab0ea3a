// Package memlimit gives the Go runtime a soft memory limit below the container's: without one, the collector
// lets the heap grow to twice what is live before it runs, and a process whose live heap is half its container's
// limit is killed for memory it does not need.
package memlimit

import (
	"bufio"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// FractionFlag defines the flag, shared by every Lifeline daemon, that Set's fraction comes from.
func FractionFlag(fs *flag.FlagSet) *float64 {
	return fs.Float64("memory-limit-fraction", 0.9,
		"share of the container's memory limit given to the Go runtime as its soft limit (GOMEMLIMIT wins when set; 0: none)")
}

// Set sets the runtime's soft limit to fraction of the container's memory limit, read from the cgroup file
// system under root (normally os.DirFS("/")). It leaves the limit alone, and says why, when GOMEMLIMIT is set,
// fraction is not in (0, 1], or the process has no memory limit. It returns the limit it set, or 0.
func Set(root fs.FS, fraction float64) (int64, string, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, "GOMEMLIMIT is set", nil
	}
	if fraction <= 0 || fraction > 1 {
		return 0, "disabled", nil
	}
	limit, err := ContainerLimit(root)
	if err != nil {
		return 0, "", err
	}
	if limit == 0 {
		return 0, "no memory limit", nil
	}
	soft := int64(float64(limit) * fraction)
	debug.SetMemoryLimit(soft)
	return soft, fmt.Sprintf("%.0f%% of the container's %d MiB", fraction*100, limit>>20), nil
}

// ContainerLimit is the memory limit of this process's cgroup, v2 or v1, in bytes; 0 when it has none.
func ContainerLimit(root fs.FS) (int64, error) {
	groups, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, fmt.Errorf("reading the process's cgroups: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(groups)))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; v2's unified hierarchy has ID 0 and no controllers.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			if v, ok, err := readLimit(root, cgroupFile("sys/fs/cgroup", parts[2], "memory.max")); ok || err != nil {
				return v, err
			}
		case hasController(parts[1], "memory"):
			if v, ok, err := readLimit(root, cgroupFile("sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")); ok || err != nil {
				return v, err
			}
		}
	}
	return 0, nil
}

// cgroupFile is where a cgroup's file is: under its own path, which inside a container's cgroup namespace is
// "/", the mount's root.
func cgroupFile(mount, group, file string) string {
	return path.Join(mount, strings.TrimPrefix(path.Clean("/"+group), "/"), file)
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readLimit reads a limit file: "max" (v2) or a value near the largest int64 (v1) means none. ok is false when
// the file is not there.
func readLimit(root fs.FS, name string) (int64, bool, error) {
	data, err := fs.ReadFile(root, name)
	if err != nil {
		return 0, false, nil
	}
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0, true, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("reading %s: %w", name, err)
	}
	if v <= 0 || v >= math.MaxInt64&^(1<<30-1) { // v1 writes "no limit" as the largest page-aligned int64
		return 0, true, nil
	}
	return v, true, nil
}
