package v1alpha1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/dynamic"

	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var (
	controlPlane *harness.ControlPlane
	dyn          dynamic.Interface
)

// TestMain starts an API server alone, with Lifeline's CRDs installed: admission and CRD validation are all
// these tests need.
func TestMain(m *testing.M) {
	root, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := harness.ControlPlaneOptions{WithoutControllerManager: true, WithoutScheduler: true,
		CRDDirs: []string{filepath.Join(root, "deploy", "crds")}, Policies: []string{filepath.Join(root, "deploy", "manifests", "lifeline.yaml")}}
	os.Exit(harness.RunTests(m, opts, func(cp *harness.ControlPlane) error {
		controlPlane = cp
		var err error
		dyn, err = dynamic.NewForConfig(cp.Config)
		return err
	}))
}
