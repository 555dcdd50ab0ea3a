package manager_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// One control plane for the package's tests; they start their own managers on it.
var (
	cp   *harness.ControlPlane
	kube client.Client
)

// runManager starts mgr until the test ends, and fails the test if it stops with an error.
func runManager(t *testing.T, mgr ctrl.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

func TestMain(m *testing.M) {
	root, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := harness.ControlPlaneOptions{WithoutScheduler: true, CRDDirs: []string{filepath.Join(root, "deploy", "crds")}, Policies: []string{filepath.Join(root, "deploy", "manifests", "lifeline.yaml")}}
	os.Exit(harness.RunTests(m, opts, func(c *harness.ControlPlane) error {
		cp = c
		scheme, err := manager.Scheme()
		if err != nil {
			return err
		}
		kube, err = client.New(c.Config, client.Options{Scheme: scheme})
		return err
	}))
}
