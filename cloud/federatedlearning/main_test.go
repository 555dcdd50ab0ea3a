package federatedlearning_test

import (
	"os"
	"testing"

	"github.com/lifeline-edge/lifeline/test/harness"
)

var (
	env        *harness.Env
	eventually = harness.Eventually
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func(e *harness.Env) { env = e }))
}
