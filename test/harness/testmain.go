package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
)

// RunTests is the body of a TestMain for a package of integration tests: it starts one control plane shared by
// the whole package, hands it to setup, runs the tests and stops it. When a test fails, or the control plane
// cannot start, it keeps the directory and prints where the control-plane logs are. It returns the exit code.
//
// With -short the control plane is not started and setup is not called, so packages that also hold unit tests
// can run those alone; integration tests then call SkipIfShort.
func RunTests(m *testing.M, opts ControlPlaneOptions, setup func(*ControlPlane) error) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	cp, err := StartControlPlane(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the control plane: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "control plane started in %.1fs\n", cp.StartupDuration.Seconds())
	if err := setup(cp); err != nil {
		fmt.Fprintf(os.Stderr, "setting up the control plane: %v\ncontrol-plane logs kept in %s\n", err, cp.Dir)
		cp.KeepDir()
		cp.Stop()
		return 1
	}
	code := m.Run()
	if err := cp.Healthy(); err != nil {
		fmt.Fprintf(os.Stderr, "the control plane failed during the tests: %v\n", err)
		code = 1
	}
	if code != 0 {
		cp.KeepDir()
		fmt.Fprintf(os.Stderr, "control-plane logs kept in %s\n", cp.Dir)
	}
	cp.Stop()
	return code
}

// SkipIfShort skips an integration test under -short, where RunTests started no control plane.
func SkipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs the control plane (run without -short)")
	}
}
