package v1alpha1_test

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// TestGoTypesKeepEverySednaField decodes every example, Lifeline's and upstream Sedna's, into the Go types and
// encodes it again: a field missing from the types would be silently dropped by the controller.
func TestGoTypesKeepEverySednaField(t *testing.T) {
	newTyped := map[string]func() runtime.Object{
		"JointInferenceService": func() runtime.Object { return &v1alpha1.JointInferenceService{} },
		"FederatedLearningJob":  func() runtime.Object { return &v1alpha1.FederatedLearningJob{} },
		"Model":                 func() runtime.Object { return &v1alpha1.Model{} },
		"Dataset":               func() runtime.Object { return &v1alpha1.Dataset{} },
	}
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		for file, objs := range loadSet(t, set) {
			for _, obj := range objs {
				typed := newTyped[obj.GetKind()]()
				sent, err := json.Marshal(obj.Object)
				if err != nil {
					t.Fatal(err)
				}
				decoder := json.NewDecoder(strings.NewReader(string(sent)))
				decoder.DisallowUnknownFields()
				if err := decoder.Decode(typed); err != nil {
					t.Errorf("%s: decoding %s into Go types: %v", file, obj.GetKind(), err)
					continue
				}
				encoded, err := json.Marshal(typed)
				if err != nil {
					t.Fatal(err)
				}
				var back map[string]any
				if err := json.Unmarshal(encoded, &back); err != nil {
					t.Fatal(err)
				}
				if lost := lostFields(obj.Object, back, ""); len(lost) > 0 {
					t.Errorf("%s: %s lost fields in the Go types:\n  %s", file, obj.GetKind(), strings.Join(lost, "\n  "))
				}
			}
		}
	})
}
