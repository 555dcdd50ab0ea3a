// Package statefile writes the agent's small state files (birth sequence, state id, desired workers) so that a
// crash or a power loss leaves either the old content or the new, never a torn or empty file.
package statefile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data: a temporary file beside it is written and synced, renamed over path, and the
// directory synced, so the rename itself survives a power loss once Write returns. The temporary file is hidden
// (a leading dot): a kubelet or edged reading a static-pod directory skips it, never reading half a manifest.
func Write(path string, data []byte) error {
	return WriteMode(path, data, 0o600)
}

// WriteMode is Write with the file's mode. Its temporary file is its own, so two processes writing one path at once
// (the agent pod and the standby, around a rollout) each rename a whole file over it.
func WriteMode(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("syncing the directory of %s: %w", path, err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("syncing the directory of %s: %w", path, err)
	}
	return nil
}
