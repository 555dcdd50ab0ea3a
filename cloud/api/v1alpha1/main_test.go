package v1alpha1_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/dynamic"

	"github.com/lifeline-edge/lifeline/test/cluster"
)

var (
	controlPlane *cluster.ControlPlane
	dyn          dynamic.Interface
)

// TestMain starts an API server alone, with Lifeline's CRDs installed: admission and CRD validation are all
// these tests need.
func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{WithoutControllerManager: true, WithoutScheduler: true},
		func(cp *cluster.ControlPlane) error {
			controlPlane = cp
			root, err := cluster.RepoRoot()
			if err != nil {
				return err
			}
			if dyn, err = dynamic.NewForConfig(cp.Config); err != nil {
				return err
			}
			return cluster.InstallCRDs(context.Background(), cp.Config, filepath.Join(root, "deploy", "crds"))
		}))
}
