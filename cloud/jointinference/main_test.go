package jointinference_test

import (
	"os"
	"testing"

	"github.com/lifeline-edge/lifeline/test/controllertest"
)

var (
	env        *controllertest.Env
	eventually = controllertest.Eventually
)

func TestMain(m *testing.M) {
	os.Exit(controllertest.Main(m, func(e *controllertest.Env) { env = e }))
}
