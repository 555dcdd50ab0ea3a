package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// DirEnv names a directory of upstream Sedna examples to check besides Lifeline's own.
const DirEnv = "LIFELINE_SEDNA_FIXTURES"

// ErrNoSedna is returned by SednaDir when no upstream Sedna examples are at hand; checks of them are then
// skipped, not failed.
var ErrNoSedna = errors.New("no upstream Sedna examples: set " + DirEnv + " to a directory of them")

// ExamplesDir is the directory of Lifeline's own examples, deploy/examples of this repository.
func ExamplesDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "examples"), nil
}

// SednaDir is the directory of upstream Sedna's examples: $LIFELINE_SEDNA_FIXTURES, which must exist when set, or
// else shared/fixtures/sedna beside the repository when it exists. It returns ErrNoSedna when there is neither.
func SednaDir() (string, error) {
	if dir := os.Getenv(DirEnv); dir != "" {
		if _, err := os.Stat(dir); err != nil {
			return "", fmt.Errorf("sedna examples from %s: %w", DirEnv, err)
		}
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(filepath.Dir(root), "shared", "fixtures", "sedna")
	if _, err := os.Stat(dir); err != nil {
		return "", ErrNoSedna
	}
	return dir, nil
}

// Set is a directory of examples in Sedna's format.
type Set struct {
	// Name names the set in test names and messages: "examples" (Lifeline's) or "sedna" (upstream's).
	Name string
	Dir  string
	// Service and Job name the set's plainest JointInferenceService and FederatedLearningJob files: a valid
	// object for tests to edit. Each holds one object of that kind, and may hold Models and Datasets.
	Service, Job string
}

// Examples is the set of Lifeline's own examples.
func Examples() (Set, error) {
	dir, err := ExamplesDir()
	if err != nil {
		return Set{}, err
	}
	return Set{Name: "examples", Dir: dir, Service: "joint-inference.yaml", Job: "federated-learning.yaml"}, nil
}

// Sedna is the set of upstream Sedna's examples, or ErrNoSedna.
func Sedna() (Set, error) {
	dir, err := SednaDir()
	if err != nil {
		return Set{}, err
	}
	return Set{Name: "sedna", Dir: dir, Service: "jointinferenceservice_v1alpha1.yaml",
		Job: "federatedlearningjob_v1alpha1.yaml"}, nil
}

// ForEachSet runs run as a subtest for Lifeline's examples, then for upstream Sedna's; the second is skipped,
// saying how to enable it, when upstream's are not at hand.
func ForEachSet(t *testing.T, run func(t *testing.T, set Set)) {
	t.Helper()
	t.Run("examples", func(t *testing.T) {
		set, err := Examples()
		if err != nil {
			t.Fatal(err)
		}
		run(t, set)
	})
	t.Run("sedna", func(t *testing.T) {
		set, err := Sedna()
		if errors.Is(err, ErrNoSedna) {
			t.Skipf("checking Lifeline's own examples only: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		run(t, set)
	})
}

// Files lists the set's YAML files by name, sorted.
func (s Set) Files() ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(s.Dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("listing %s examples: %w", s.Name, err)
	}
	files := make([]string, 0, len(paths))
	for _, p := range paths {
		files = append(files, filepath.Base(p))
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no YAML file in %s", s.Dir)
	}
	return files, nil
}

// FilesOf lists the set's files that hold an object of kind.
func (s Set) FilesOf(kind string, vars map[string]string) ([]string, error) {
	files, err := s.Files()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		objs, err := s.Load(f, vars)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.GetKind() == kind {
				out = append(out, f)
				break
			}
		}
	}
	return out, nil
}

// Load reads every object of the set's file, placeholders substituted from vars.
func (s Set) Load(file string, vars map[string]string) ([]*unstructured.Unstructured, error) {
	return Load(filepath.Join(s.Dir, file), vars)
}

// LoadObject decodes into the first object of the set's file whose kind is into's, placeholders substituted
// from vars; into is one of the types of cloud/api/v1alpha1.
func (s Set) LoadObject(file string, vars map[string]string, into apiruntime.Object) error {
	kinds, _, err := scheme.ObjectKinds(into)
	if err != nil {
		return fmt.Errorf("loading %s: %w", file, err)
	}
	objs, err := s.Load(file, vars)
	if err != nil {
		return err
	}
	kind := kinds[0].Kind
	for _, o := range objs {
		if o.GetKind() == kind {
			if err := apiruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				return fmt.Errorf("decoding the %s of %s: %w", kind, file, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%s example %s holds no %s", s.Name, file, kind)
}

// Objects decodes every object of the set's file, in file order, into the types of cloud/api/v1alpha1:
// what `kubectl apply -f` of the file would create.
func (s Set) Objects(file string, vars map[string]string) ([]client.Object, error) {
	objs, err := s.Load(file, vars)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		typed, err := scheme.New(o.GroupVersionKind())
		if err != nil {
			return nil, fmt.Errorf("%s of %s: %w", o.GetKind(), file, err)
		}
		if err := apiruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, typed); err != nil {
			return nil, fmt.Errorf("decoding the %s %s of %s: %w", o.GetKind(), o.GetName(), file, err)
		}
		out = append(out, typed.(client.Object))
	}
	return out, nil
}

// scheme knows the kinds of the examples.
var scheme = func() *apiruntime.Scheme {
	s := apiruntime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// LoadObject decodes the object of into's kind from Lifeline's example file (e.g. "joint-inference.yaml").
func LoadObject(file string, vars map[string]string, into apiruntime.Object) error {
	set, err := Examples()
	if err != nil {
		return err
	}
	return set.LoadObject(file, vars, into)
}

// Objects decodes every object of Lifeline's example file, as Set.Objects does.
func Objects(file string, vars map[string]string) ([]client.Object, error) {
	set, err := Examples()
	if err != nil {
		return nil, err
	}
	return set.Objects(file, vars)
}

var placeholder = regexp.MustCompile(`\$\{?([A-Z_][A-Z0-9_]*)\}?`)

// Substitute replaces shell placeholders ($EDGE_NODE, ${CLOUD_NODE}) the way envsubst does, from vars; a
// placeholder not in vars is an error, so an example never reaches the API server half-substituted.
func Substitute(data []byte, vars map[string]string) ([]byte, error) {
	var missing []string
	out := placeholder.ReplaceAllFunc(data, func(m []byte) []byte {
		name := string(placeholder.FindSubmatch(m)[1])
		v, ok := vars[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		return []byte(v)
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("no value for placeholders %v", missing)
	}
	return out, nil
}

// DefaultVars are the placeholder values tests use; the controllers' tests run a fake kubelet for each node.
var DefaultVars = map[string]string{"EDGE_NODE": "edge-node", "EDGE_NODE_1": "edge1", "EDGE_NODE_2": "edge2",
	"CLOUD_NODE": "cloud-node", "API_KEY": "test-key"}

// Load reads every object of a YAML file, substituting placeholders from vars.
func Load(path string, vars map[string]string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading example: %w", err)
	}
	if data, err = Substitute(data, vars); err != nil {
		return nil, fmt.Errorf("example %s: %w", filepath.Base(path), err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decoding %s: %w", filepath.Base(path), err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs, nil
}
