package main

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// podTemplate is the part of corev1.PodTemplateSpec's schema that constrain looks at.
const podTemplate = `
type: object
properties:
  metadata: {type: object}
  spec:
    type: object
    required: [containers]
    properties:
      containers: {type: array, items: {type: object}}`

func crd(t *testing.T, kind, properties string) map[string]any {
	t.Helper()
	doc := `
spec:
  names: {kind: ` + kind + `}
  versions:
  - name: v1alpha1
    schema:
      openAPIV3Schema:
        type: object
        properties:
          metadata: {type: object}
          spec:
            type: object
            properties:` + properties
	out := map[string]any{}
	if err := yaml.Unmarshal([]byte(doc), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestConstrain(t *testing.T) {
	indent := func(s string, n int) string { return strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", n)) }
	cases := []struct {
		name, kind, properties string
		// paths to the schemas that must carry each constraint, from the version's openAPIV3Schema
		minItems, requireSpec [][]string
		nameMax               bool
	}{
		{"JI: both templates and the name", "JointInferenceService",
			"\n              edgeWorker:\n                type: object\n                properties:\n                  template:" + indent(podTemplate, 20) +
				"\n              cloudWorker:\n                type: object\n                properties:\n                  template:" + indent(podTemplate, 20),
			[][]string{{"edgeWorker", "template", "spec", "containers"}, {"cloudWorker", "template", "spec", "containers"}},
			[][]string{{"edgeWorker", "template"}, {"cloudWorker", "template"}}, true},
		{"FL: a template inside a list's items, no name rule", "FederatedLearningJob",
			"\n              trainingWorkers:\n                type: array\n                items:\n                  type: object\n                  properties:\n                    template:" + indent(podTemplate, 22),
			[][]string{{"trainingWorkers", "*", "template", "spec", "containers"}},
			[][]string{{"trainingWorkers", "*", "template"}}, false},
		{"a template that is not a pod's is left alone", "FederatedLearningJob",
			"\n              template:\n                type: object\n                properties:\n                  spec: {type: object}",
			nil, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := crd(t, tc.kind, tc.properties)
			if err := constrain(obj); err != nil {
				t.Fatal(err)
			}
			root := dig(obj, "spec", "versions").([]any)[0]
			spec := dig(root, "schema", "openAPIV3Schema", "properties", "spec").(map[string]any)
			for _, p := range tc.minItems {
				if got := schemaAt(spec, p)["minItems"]; got != 1 {
					t.Errorf("%v: minItems %v, want 1", p, got)
				}
			}
			for _, p := range tc.requireSpec {
				if got := schemaAt(spec, p)["required"]; !reflect.DeepEqual(got, []any{"spec"}) {
					t.Errorf("%v: required %v, want [spec]", p, got)
				}
			}
			if tc.minItems == nil {
				if got := dig(spec, "properties", "template", "required"); got != nil {
					t.Errorf("a template without containers got required %v", got)
				}
			}
			name := dig(root, "schema", "openAPIV3Schema", "properties", "metadata", "properties", "name", "maxLength")
			if tc.nameMax && name != MaxJointInferenceServiceName || !tc.nameMax && name != nil {
				t.Errorf("metadata.name maxLength %v (want it: %v)", name, tc.nameMax)
			}
		})
	}
}

func TestConstrainRefusesWhatIsNotACRD(t *testing.T) {
	if err := constrain(map[string]any{"kind": "ConfigMap"}); err == nil {
		t.Error("a ConfigMap was taken for a CRD")
	}
}

// schemaAt follows property names from schema; "*" steps into a list's items.
func schemaAt(schema map[string]any, path []string) map[string]any {
	for _, p := range path {
		if p == "*" {
			schema = schema["items"].(map[string]any)
			continue
		}
		schema = dig(schema, "properties", p).(map[string]any)
	}
	return schema
}
