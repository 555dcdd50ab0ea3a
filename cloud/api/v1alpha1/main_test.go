package v1alpha1_test

import (
	"fmt"
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
	root, err := cluster.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := cluster.Options{WithoutControllerManager: true, WithoutScheduler: true,
		CRDDirs: []string{filepath.Join(root, "deploy", "crds")}}
	os.Exit(cluster.RunTests(m, opts, func(cp *cluster.ControlPlane) error {
		controlPlane = cp
		var err error
		dyn, err = dynamic.NewForConfig(cp.Config)
		return err
	}))
}
