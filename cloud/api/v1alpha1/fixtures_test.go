package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var resources = map[string]string{
	"JointInferenceService": "jointinferenceservices",
	"FederatedLearningJob":  "federatedlearningjobs",
	"Model":                 "models",
	"Dataset":               "datasets",
}

func resourceFor(t *testing.T, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	plural, ok := resources[obj.GetKind()]
	if !ok {
		t.Fatalf("fixture kind %q is not a sedna.io kind", obj.GetKind())
	}
	gvr := schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: plural}
	return dyn.Resource(gvr).Namespace(obj.GetNamespace())
}

func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	client := kubernetes.NewForConfigOrDie(controlPlane.Config)
	ns, err := client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// apply sends obj with server-side apply, as `kubectl apply --server-side` does, and returns what the server stored.
func apply(t *testing.T, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	t.Helper()
	data, err := json.Marshal(obj.Object)
	if err != nil {
		t.Fatal(err)
	}
	force := true
	return resourceFor(t, obj).Patch(context.Background(), obj.GetName(), "application/apply-patch+yaml", data,
		metav1.PatchOptions{FieldManager: "fixture-test", Force: &force})
}

// loadSet reads every file of an example set, and checks that the set shows every kind Lifeline serves.
func loadSet(t *testing.T, set testkit.Set) map[string][]*unstructured.Unstructured {
	t.Helper()
	files, err := set.Files()
	if err != nil {
		t.Fatal(err)
	}
	all := map[string][]*unstructured.Unstructured{}
	kinds := map[string]bool{}
	for _, f := range files {
		objs, err := set.Load(f, testkit.DefaultVars)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			kinds[o.GetKind()] = true
		}
		all[f] = objs
	}
	for kind := range resources {
		if !kinds[kind] {
			t.Errorf("no %s among the %d %s files in %s", kind, len(files), set.Name, set.Dir)
		}
	}
	return all
}

// TestExamplesApplyUnchanged applies every example, Lifeline's and upstream Sedna's, as it is and reads it back:
// every field sent must come back with the same value. Each file gets its own namespace, since examples share
// names.
func TestExamplesApplyUnchanged(t *testing.T) {
	harness.SkipIfShort(t)
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		for file, objs := range loadSet(t, set) {
			t.Run(file, func(t *testing.T) {
				ns := newNamespace(t, "fixture")
				for _, obj := range objs {
					obj.SetNamespace(ns)
					got, err := apply(t, obj)
					if err != nil {
						t.Fatalf("applying %s %s: %v", obj.GetKind(), obj.GetName(), err)
					}
					if lost := lostFields(obj.Object, got.Object, ""); len(lost) > 0 {
						t.Errorf("%s %s lost or changed fields on the server:\n  %s", obj.GetKind(), obj.GetName(),
							strings.Join(lost, "\n  "))
					}
				}
			})
		}
	})
}

// TestTemplateMetadataIsPreserved guards against the pruning of Sedna's own CRDs, which drop the labels and
// annotations of worker templates.
func TestTemplateMetadataIsPreserved(t *testing.T) {
	harness.SkipIfShort(t)
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		ns := newNamespace(t, "template-meta")
		for _, obj := range []*unstructured.Unstructured{validJI(t, set), validFL(t, set)} {
			obj.SetNamespace(ns)
			for _, path := range templatePaths(obj) {
				meta := map[string]any{
					"labels":      map[string]any{"team": "vision"},
					"annotations": map[string]any{"example.com/owner": "alice"},
				}
				setField(t, obj, meta, append(path, "metadata")...)
			}
			got, err := apply(t, obj)
			if err != nil {
				t.Fatalf("applying %s: %v", obj.GetKind(), err)
			}
			if lost := lostFields(obj.Object, got.Object, ""); len(lost) > 0 {
				t.Errorf("%s lost template metadata:\n  %s", obj.GetKind(), strings.Join(lost, "\n  "))
			}
		}
	})
}

// TestPrinterColumns runs the built kubectl, as a user would.
func TestPrinterColumns(t *testing.T) {
	harness.SkipIfShort(t)
	examples, err := testkit.Examples()
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, "columns")
	for _, obj := range []*unstructured.Unstructured{validJI(t, examples), validFL(t, examples)} {
		obj.SetNamespace(ns)
		if _, err := apply(t, obj); err != nil {
			t.Fatal(err)
		}
	}
	for kind, want := range map[string][]string{
		"ji": {"NAME", "READY", "EDGE", "CLOUD", "AGE"},
		"fl": {"NAME", "PHASE", "ROUND", "ACTIVE", "SUCCEEDED", "FAILED", "AGE"},
	} {
		out, err := exec.Command(filepath.Join(controlPlane.BinDir, harness.KubectlBinary),
			"--kubeconfig", controlPlane.Kubeconfig, "get", kind, "-n", ns).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl get %s: %v\n%s", kind, err, out)
		}
		header := strings.Fields(strings.SplitN(string(out), "\n", 2)[0])
		if !reflect.DeepEqual(header, want) {
			t.Errorf("kubectl get %s columns = %v, want %v\n%s", kind, header, want, out)
		}
	}
}

// lostFields lists the paths where got lacks or differs from a value of sent. Numbers compare by value, since
// YAML and JSON decode them into different Go types.
func lostFields(sent, got any, path string) []string {
	switch s := sent.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: sent an object, got %T", path, got)}
		}
		var lost []string
		keys := make([]string, 0, len(s))
		for k := range s {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			gv, ok := g[k]
			if !ok {
				lost = append(lost, path+"."+k+": missing")
				continue
			}
			lost = append(lost, lostFields(s[k], gv, path+"."+k)...)
		}
		return lost
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(s) {
			return []string{fmt.Sprintf("%s: sent %d items, got %v", path, len(s), got)}
		}
		var lost []string
		for i := range s {
			lost = append(lost, lostFields(s[i], g[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return lost
	default:
		if fmt.Sprint(sent) != fmt.Sprint(got) {
			return []string{fmt.Sprintf("%s: sent %v, got %v", path, sent, got)}
		}
		return nil
	}
}
