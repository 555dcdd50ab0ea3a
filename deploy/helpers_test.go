package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

const (
	chartDir      = "chart/lifeline"
	manifestsFile = "manifests/lifeline.yaml"
	namespace     = "lifeline-system"
)

// helmBinary is the pinned helm that make tools builds beside the control plane's binaries.
func helmBinary(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(harness.BinDirEnv)
	if dir == "" {
		dir = filepath.Join("..", "bin")
	}
	bin, err := filepath.Abs(filepath.Join(dir, "helm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		if testing.Short() {
			t.Skipf("no helm at %s (make tools builds it)", bin)
		}
		t.Fatalf("no helm at %s: run make tools", bin)
	}
	return bin
}

// runHelm runs helm with args and returns its standard output, or its error with standard error.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	// Helm keeps caches and repositories under these; the test's own directories keep it off the user's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, errors.New(err.Error() + ": " + stderr.String())
	}
	return out, nil
}

// renderChart renders the chart into the lifeline-system namespace with the given helm flags (--set ...).
func renderChart(t *testing.T, flags ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := runHelm(t, append([]string{"template", "lifeline", chartDir, "--namespace", namespace}, flags...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v", flags, err)
	}
	return decodeObjects(t, "helm template", out)
}

// readManifests decodes the plain manifests generated from the chart.
func readManifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(manifestsFile)
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, manifestsFile, data)
}

// decodeObjects decodes every object of a multi-document YAML stream.
func decodeObjects(t *testing.T, source string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", source, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		t.Fatalf("%s holds no object", source)
	}
	return objs
}

// object returns the one object of that kind and name, converted strictly into T, or nil when there is none.
func object[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != kind || o.GetName() != name {
			continue
		}
		into := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, into, true); err != nil {
			t.Fatalf("%s %s does not parse: %v", kind, name, err)
		}
		return into
	}
	return nil
}

// mustObject is object for an object that must be there.
func mustObject[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	o := object[T](t, objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s", kind, name)
	}
	return o
}

// testCA writes a self-signed CA certificate in PEM, standing for KubeEdge's, and returns its path and text.
func testCA(t *testing.T, cn string) (string, string) {
	t.Helper()
	text := string(testkit.NewCA(t, cn).PEM())
	path := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, text
}
