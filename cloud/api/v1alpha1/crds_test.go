package v1alpha1_test

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// schemaOf reads the v1alpha1 schema of a CRD file.
func schemaOf(t *testing.T, path string) *apiextensionsv1.JSONSchemaProps {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(crd); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1alpha1" && v.Schema != nil {
			return v.Schema.OpenAPIV3Schema
		}
	}
	t.Fatalf("%s has no v1alpha1 schema", path)
	return nil
}

// fieldPaths lists the paths of every field a schema declares ("spec.edgeWorker.model.name"; "[]" for the items
// of a list, "{}" for the values of a map).
func fieldPaths(s *apiextensionsv1.JSONSchemaProps, path string, into map[string]bool) {
	for name, p := range s.Properties {
		child := strings.TrimPrefix(path+"."+name, ".")
		into[child] = true
		fieldPaths(&p, child, into)
	}
	if s.Items != nil && s.Items.Schema != nil {
		fieldPaths(s.Items.Schema, path+"[]", into)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		fieldPaths(s.AdditionalProperties.Schema, path+"{}", into)
	}
}

// removedFromKubernetes are pod template fields upstream's CRDs still declare from the older Kubernetes API they
// were built with, which Kubernetes itself has since removed: the alpha PodResourceClaim.source, replaced in 1.31
// by resourceClaimName and resourceClaimTemplateName on the claim. No current pod can carry them.
var removedFromKubernetes = []string{".template.spec.resourceClaims[].source"}

func removed(path string) bool {
	for _, r := range removedFromKubernetes {
		if strings.Contains(path, r) {
			return true
		}
	}
	return false
}

// TestCRDsDeclareEverySednaSpecField compares Lifeline's CRDs with upstream Sedna's, field by field: every spec
// field upstream declares, Lifeline's must declare too, or the API server would prune it from what users apply.
func TestCRDsDeclareEverySednaSpecField(t *testing.T) {
	set, err := testkit.Sedna()
	if err != nil {
		t.Skipf("comparing with upstream Sedna's CRDs needs its examples and crds/: %v", err)
	}
	upstream, err := filepath.Glob(filepath.Join(set.Dir, "crds", "sedna.io_*.yaml"))
	if err != nil || len(upstream) == 0 {
		t.Skipf("no upstream CRDs in %s: %v", filepath.Join(set.Dir, "crds"), err)
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range upstream {
		t.Run(filepath.Base(path), func(t *testing.T) {
			theirs, ours := map[string]bool{}, map[string]bool{}
			fieldPaths(schemaOf(t, path), "", theirs)
			fieldPaths(schemaOf(t, filepath.Join(root, "deploy", "crds", filepath.Base(path))), "", ours)
			var missing []string
			for p := range theirs {
				if strings.HasPrefix(p, "spec.") && !ours[p] && !removed(p) {
					missing = append(missing, p)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("%d spec fields of Sedna's CRD missing from Lifeline's:\n  %s", len(missing),
					strings.Join(missing, "\n  "))
			}
			if len(theirs) == 0 || len(ours) == 0 {
				t.Errorf("no fields read: %d upstream, %d Lifeline's", len(theirs), len(ours))
			}
		})
	}
}
