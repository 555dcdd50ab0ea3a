package manager_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/cluster"
)

// One control plane for the package's tests; they start their own managers on it.
var (
	cp   *cluster.ControlPlane
	kube client.Client
)

func TestMain(m *testing.M) {
	root, err := cluster.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := cluster.Options{WithoutScheduler: true, CRDDirs: []string{filepath.Join(root, "deploy", "crds")}}
	os.Exit(cluster.RunTests(m, opts, func(c *cluster.ControlPlane) error {
		cp = c
		scheme, err := manager.Scheme()
		if err != nil {
			return err
		}
		kube, err = client.New(c.Config, client.Options{Scheme: scheme})
		return err
	}))
}
