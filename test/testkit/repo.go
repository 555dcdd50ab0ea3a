package testkit

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const modulePath = "github.com/lifeline-edge/lifeline"

// RepoRoot walks up from the working directory to the directory that holds this module's go.mod.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if isRepoRoot(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of %s above %s", modulePath, wd)
		}
	}
}

func isRepoRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == modulePath
		}
	}
	return false
}
