package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// AtGate tells whether the process pid runs an armed stand-in's gate, the agent's binary staged as lifeline-gate
// waiting to execute the container's command, rather than that command: a gated container runs, yet no instance of
// its worker does.
func AtGate(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv := strings.Split(string(data), "\x00")
	return len(argv) > 1 && filepath.Base(argv[0]) == "lifeline-gate" && argv[1] == "gate"
}
