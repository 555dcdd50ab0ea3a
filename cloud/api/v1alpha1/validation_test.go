package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var objectSeq atomic.Int32

// exampleObject loads the object of kind from a file of set under a fresh name.
func exampleObject(t *testing.T, set testkit.Set, file, kind string) *unstructured.Unstructured {
	t.Helper()
	objs, err := set.Load(file, testkit.DefaultVars)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if obj.GetKind() == kind {
			obj.SetName(fmt.Sprintf("%s-%d", obj.GetName(), objectSeq.Add(1)))
			return obj
		}
	}
	t.Fatalf("%s example %s holds no %s", set.Name, file, kind)
	return nil
}

// validJI is the set's plainest JointInferenceService, as users write it.
func validJI(t *testing.T, set testkit.Set) *unstructured.Unstructured {
	return exampleObject(t, set, set.Service, "JointInferenceService")
}

// validFL is the set's plainest FederatedLearningJob, as users write it.
func validFL(t *testing.T, set testkit.Set) *unstructured.Unstructured {
	return exampleObject(t, set, set.Job, "FederatedLearningJob")
}

// templatePaths lists the paths of every pod template in a JI or FL.
func templatePaths(obj *unstructured.Unstructured) [][]string {
	if obj.GetKind() == "JointInferenceService" {
		return [][]string{{"spec", "edgeWorker", "template"}, {"spec", "cloudWorker", "template"}}
	}
	paths := [][]string{{"spec", "aggregationWorker", "template"}}
	workers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "trainingWorkers")
	for i := range workers {
		paths = append(paths, []string{"spec", "trainingWorkers", fmt.Sprint(i), "template"})
	}
	return paths
}

// setField sets value at path; a numeric element indexes a list.
func setField(t *testing.T, obj *unstructured.Unstructured, value any, path ...string) {
	t.Helper()
	var cur any = obj.Object
	for i, key := range path {
		last := i == len(path)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				c[key] = value
				return
			}
			if _, ok := c[key]; !ok {
				c[key] = map[string]any{}
			}
			cur = c[key]
		case []any:
			var idx int
			if _, err := fmt.Sscan(key, &idx); err != nil || idx >= len(c) {
				t.Fatalf("bad index %q in %v", key, path)
			}
			if last {
				c[idx] = value
				return
			}
			cur = c[idx]
		default:
			t.Fatalf("cannot descend into %T at %q of %v", cur, key, path)
		}
	}
}

func deleteField(obj *unstructured.Unstructured, path ...string) {
	unstructured.RemoveNestedField(obj.Object, path...)
}

func create(t *testing.T, obj *unstructured.Unstructured) error {
	t.Helper()
	_, err := resourceFor(t, obj).Create(context.Background(), obj, metav1.CreateOptions{})
	return err
}

// assertAdmission checks the API server's answer: accepted when wantErr is empty, else rejected with a message
// containing wantErr.
func assertAdmission(t *testing.T, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("rejected: %v", err)
	case wantErr != "" && err == nil:
		t.Fatalf("accepted, want rejection with %q", wantErr)
	case wantErr != "" && !strings.Contains(err.Error(), wantErr):
		t.Fatalf("rejected with\n  %v\nwant a message containing\n  %s", err, wantErr)
	}
}

func hpa(min, max int64) map[string]any {
	return map[string]any{"minReplicas": min, "maxReplicas": max}
}

// TestAdmissionRules creates one object per rule: each is either accepted or rejected with a message that names
// the field.
func TestAdmissionRules(t *testing.T) {
	harness.SkipIfShort(t)
	cases := []struct {
		name    string
		base    func(*testing.T, testkit.Set) *unstructured.Unstructured
		mutate  func(*testing.T, *unstructured.Unstructured)
		wantErr string // empty: accepted
	}{
		{"JI as the example has it", validJI, func(*testing.T, *unstructured.Unstructured) {}, ""},
		{"FL as the example has it", validFL, func(*testing.T, *unstructured.Unstructured) {}, ""},
		{"FL with no training workers", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, []any{}, "spec", "trainingWorkers")
		}, "spec.trainingWorkers: Invalid value: 0: spec.trainingWorkers in body should have at least 1 items"},
		{"FL without training workers", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			deleteField(o, "spec", "trainingWorkers")
		}, "spec.trainingWorkers: Required value"},
		{"JI edge model with an empty name", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "", "spec", "edgeWorker", "model", "name")
		}, "spec.edgeWorker.model.name in body should be at least 1 chars long"},
		{"JI cloud model with an empty name", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "", "spec", "cloudWorker", "model", "name")
		}, "spec.cloudWorker.model.name in body should be at least 1 chars long"},
		{"JI hard example mining with an empty name", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "", "spec", "edgeWorker", "hardExampleMining", "name")
		}, "spec.edgeWorker.hardExampleMining.name in body should be at least 1 chars long"},
		{"FL aggregator model with an empty name", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "", "spec", "aggregationWorker", "model", "name")
		}, "spec.aggregationWorker.model.name in body should be at least 1 chars long"},
		{"FL trainer dataset with an empty name", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "", "spec", "trainingWorkers", "1", "dataset", "name")
		}, "spec.trainingWorkers[1].dataset.name in body should be at least 1 chars long"},
		{"FL pretrained model with an empty name, as Go clients on Sedna's types send none", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"name": ""}, "spec", "pretrainedModel")
		}, ""},
		{"JI edge hpa scaling to zero", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, hpa(0, 2), "spec", "edgeWorker", "hpa")
		}, ""},
		{"JI cloud hpa with negative minReplicas", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, hpa(-1, 2), "spec", "cloudWorker", "hpa")
		}, "spec.cloudWorker.hpa.minReplicas in body should be greater than or equal to 0"},
		{"JI edge hpa max equal to min", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, hpa(2, 2), "spec", "edgeWorker", "hpa")
		}, ""},
		{"JI edge hpa max below min", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, hpa(3, 2), "spec", "edgeWorker", "hpa")
		}, "spec.edgeWorker.hpa.maxReplicas: Invalid value: must be greater than or equal to minReplicas"},
		{"JI cloud hpa max below min", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, hpa(5, 1), "spec", "cloudWorker", "hpa")
		}, "spec.cloudWorker.hpa.maxReplicas: Invalid value: must be greater than or equal to minReplicas"},
		{"JI cloud hpa without minReplicas", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"maxReplicas": int64(3)}, "spec", "cloudWorker", "hpa")
		}, ""},
		{"JI edge template with no containers", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, []any{}, "spec", "edgeWorker", "template", "spec", "containers")
		}, "spec.edgeWorker.template.spec.containers in body should have at least 1 items"},
		{"JI cloud template with no pod spec", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			deleteField(o, "spec", "cloudWorker", "template", "spec")
		}, "spec.cloudWorker.template.spec: Required value"},
		{"FL aggregator template with no containers", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, []any{}, "spec", "aggregationWorker", "template", "spec", "containers")
		}, "spec.aggregationWorker.template.spec.containers in body should have at least 1 items"},
		{"FL trainer template with no containers", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, []any{}, "spec", "trainingWorkers", "0", "template", "spec", "containers")
		}, "spec.trainingWorkers[0].template.spec.containers in body should have at least 1 items"},
		{"FL run policy with an unknown trainer completion policy", validFL, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"trainersOnCompletion": "Linger"}, "spec", "runPolicy")
		}, `spec.runPolicy.trainersOnCompletion: Unsupported value: "Linger": supported values: "Stop", "Wait"`},
		{"JI with a 53-character name", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			o.SetName(strings.Repeat("a", 53))
		}, ""},
		{"JI with a 54-character name", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			o.SetName(strings.Repeat("b", 54))
		}, "metadata.name: Too long: may not be more than 53 bytes"},
		{"JI offline policy with an unknown action", validJI, func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"action": "Reboot"}, "spec", "edgeWorker", "offlinePolicy")
		}, `spec.edgeWorker.offlinePolicy.action: Unsupported value: "Reboot": supported values: "Restart", "None"`},
	}
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		ns := newNamespace(t, "admission")
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				obj := tc.base(t, set)
				obj.SetNamespace(ns)
				tc.mutate(t, obj)
				assertAdmission(t, create(t, obj), tc.wantErr)
			})
		}
	})
}

// TestFederatedLearningJobSpecIsImmutable edits a created FL job: its workers cannot change, its run policy can.
func TestFederatedLearningJobSpecIsImmutable(t *testing.T) {
	harness.SkipIfShort(t)
	immutable := func(field string) string {
		return field + " is immutable: delete and re-create the FederatedLearningJob to change it"
	}
	cases := []struct {
		name    string
		edit    func(*testing.T, *unstructured.Unstructured)
		wantErr string
	}{
		{"trainer template env", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, []any{map[string]any{"name": "epochs", "value": "5"}},
				"spec", "trainingWorkers", "0", "template", "spec", "containers", "0", "env")
		}, immutable("spec.trainingWorkers")},
		{"trainer dataset", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "other-dataset", "spec", "trainingWorkers", "1", "dataset", "name")
		}, immutable("spec.trainingWorkers")},
		{"trainer removed", func(t *testing.T, o *unstructured.Unstructured) {
			workers, _, _ := unstructured.NestedSlice(o.Object, "spec", "trainingWorkers")
			setField(t, o, workers[:1], "spec", "trainingWorkers")
		}, immutable("spec.trainingWorkers")},
		{"trainer template labels", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"labels": map[string]any{"a": "b"}}, "spec", "trainingWorkers", "0", "template", "metadata")
		}, immutable("spec.trainingWorkers")},
		{"aggregator image", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "agg:v2", "spec", "aggregationWorker", "template", "spec", "containers", "0", "image")
		}, immutable("spec.aggregationWorker")},
		{"aggregator model", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, "other-model", "spec", "aggregationWorker", "model", "name")
		}, immutable("spec.aggregationWorker")},
		{"pretrained model added", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"name": "late"}, "spec", "pretrainedModel")
		}, immutable("spec.pretrainedModel")},
		{"transmitter added", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, map[string]any{"ws": map[string]any{}}, "spec", "transmitter")
		}, immutable("spec.transmitter")},
		{"backoff limit", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, int64(9), "spec", "runPolicy", "backoffLimit")
		}, ""},
		{"active deadline and TTL", func(t *testing.T, o *unstructured.Unstructured) {
			setField(t, o, int64(3600), "spec", "runPolicy", "activeDeadlineSeconds")
			setField(t, o, int64(60), "spec", "runPolicy", "ttlSecondsAfterFinished")
		}, ""},
		{"job labels", func(t *testing.T, o *unstructured.Unstructured) {
			o.SetLabels(map[string]string{"team": "vision"})
		}, ""},
	}
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		ns := newNamespace(t, "immutable")
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				obj := validFL(t, set)
				obj.SetNamespace(ns)
				if err := create(t, obj); err != nil {
					t.Fatalf("creating: %v", err)
				}
				current, err := resourceFor(t, obj).Get(context.Background(), obj.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				tc.edit(t, current)
				_, err = resourceFor(t, current).Update(context.Background(), current, metav1.UpdateOptions{})
				assertAdmission(t, err, tc.wantErr)
			})
		}
	})
}

// TestJointInferenceServiceTemplateIsEditable: a JI is a long-running service, edited in place like a Deployment.
func TestJointInferenceServiceTemplateIsEditable(t *testing.T) {
	harness.SkipIfShort(t)
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		ns := newNamespace(t, "ji-edit")
		obj := validJI(t, set)
		obj.SetNamespace(ns)
		if err := create(t, obj); err != nil {
			t.Fatal(err)
		}
		current, err := resourceFor(t, obj).Get(context.Background(), obj.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		setField(t, current, "little:v2", "spec", "edgeWorker", "template", "spec", "containers", "0", "image")
		setField(t, current, "big-model-v2", "spec", "cloudWorker", "model", "name")
		updated, err := resourceFor(t, current).Update(context.Background(), current, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("editing the JI: %v", err)
		}
		image, _, _ := unstructured.NestedSlice(updated.Object, "spec", "edgeWorker", "template", "spec", "containers")
		if got := image[0].(map[string]any)["image"]; got != "little:v2" {
			t.Errorf("edge image after edit = %v, want little:v2", got)
		}
		if updated.GetGeneration() != 2 {
			t.Errorf("generation after one spec edit = %d, want 2", updated.GetGeneration())
		}
	})
}
