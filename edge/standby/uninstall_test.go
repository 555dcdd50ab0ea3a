package standby

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
)

// The standby and its files leave the node only when the agent's DaemonSet is gone; an upgrade, a restart or an
// API server that cannot tell leaves them, and nothing else in the kubelet's manifest directory is touched.
func TestStandbyIsRemovedOnlyOnceItsDaemonSetIsGone(t *testing.T) {
	for _, tc := range []struct {
		name        string
		daemonSet   string
		gone        bool
		err         error
		wantRemoved bool
	}{
		{"uninstalled", "lifeline-system/lifeline-agent", true, nil, true},
		{"upgraded or restarted", "lifeline-system/lifeline-agent", false, nil, false},
		{"the API server cannot tell", "lifeline-system/lifeline-agent", false, errors.New("connection refused"), false},
		{"no DaemonSet named", "", true, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			staticDir, stateDir := t.TempDir(), t.TempDir()
			manifest := filepath.Join(staticDir, standbyManifestFile)
			other := filepath.Join(staticDir, "kube-proxy.yaml")
			files := FilesIn(stateDir)
			if err := os.MkdirAll(files.Dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{manifest, other, filepath.Join(files.Dir, "ca.crt")} {
				if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var asked string
			RemoveIfUninstalled(t.Context(), tc.daemonSet, staticDir, stateDir, func(_ context.Context, namespace, name string) (bool, error) {
				asked = namespace + "/" + name
				return tc.gone, tc.err
			}, logr.Discard())

			_, manifestErr := os.Stat(manifest)
			_, filesErr := os.Stat(files.Dir)
			if removed := os.IsNotExist(manifestErr) && os.IsNotExist(filesErr); removed != tc.wantRemoved {
				t.Errorf("standby removed: %v (manifest: %v, files: %v), want %v", removed, manifestErr, filesErr, tc.wantRemoved)
			}
			if _, err := os.Stat(other); err != nil {
				t.Errorf("another static pod's manifest: %v", err)
			}
			if tc.daemonSet != "" && asked != tc.daemonSet {
				t.Errorf("asked about %q, want the DaemonSet %q", asked, tc.daemonSet)
			}
		})
	}
}
