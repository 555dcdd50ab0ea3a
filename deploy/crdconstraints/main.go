// Command crdconstraints adds to the CRDs controller-gen writes the constraints its markers cannot reach: those
// inside corev1's pod template, and the length of a root object's name. They are OpenAPI constraints, not CEL
// rules: the API server evaluates a CRD's CEL rules on every write of an object, status writes included, and in a
// regional outage, when every workload's status is written at once, that was a tenth of its CPU. OpenAPI
// constraints ride on the schema validation every write has anyway.
//
// Usage: crdconstraints FILE... (rewrites each CRD file in place).
package main

import (
	"fmt"
	"os"
	"slices"

	"sigs.k8s.io/yaml"
)

// MaxJointInferenceServiceName is the longest name of a JointInferenceService: the name is part of its workers'
// label values (`<name>-Cloud-svc`), which are at most 63 characters.
const MaxJointInferenceServiceName = 53

func main() {
	for _, path := range os.Args[1:] {
		if err := constrainFile(path); err != nil {
			fmt.Fprintln(os.Stderr, "crdconstraints:", err)
			os.Exit(1)
		}
	}
}

func constrainFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	crd := map[string]any{}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if err := constrain(crd); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.WriteFile(path, append([]byte("---\n"), out...), 0o644)
}

// constrain adds, to the schema of every version of crd: every pod template carries a pod spec that lists at
// least one container; and a JointInferenceService's name is at most MaxJointInferenceServiceName characters.
func constrain(crd map[string]any) error {
	kind, _ := dig(crd, "spec", "names", "kind").(string)
	versions, _ := dig(crd, "spec", "versions").([]any)
	if kind == "" || len(versions) == 0 {
		return fmt.Errorf("not a CustomResourceDefinition with versions")
	}
	for _, v := range versions {
		root, ok := dig(v, "schema", "openAPIV3Schema").(map[string]any)
		if !ok {
			return fmt.Errorf("a version of %s has no schema", kind)
		}
		constrainPodTemplates(root)
		if kind == "JointInferenceService" {
			metadata, ok := dig(root, "properties", "metadata").(map[string]any)
			if !ok {
				return fmt.Errorf("the schema of %s has no metadata", kind)
			}
			metadata["properties"] = map[string]any{"name": map[string]any{"type": "string", "maxLength": MaxJointInferenceServiceName}}
		}
	}
	return nil
}

// constrainPodTemplates walks schema and, in every property named template whose spec lists containers (a pod
// template), requires the spec and at least one container.
func constrainPodTemplates(schema map[string]any) {
	props, _ := schema["properties"].(map[string]any)
	for name, p := range props {
		prop, ok := p.(map[string]any)
		if !ok {
			continue
		}
		if containers, ok := dig(prop, "properties", "spec", "properties", "containers").(map[string]any); ok && name == "template" {
			containers["minItems"] = 1
			required, _ := prop["required"].([]any)
			if !slices.Contains(required, any("spec")) {
				prop["required"] = append(required, "spec")
			}
			continue
		}
		constrainPodTemplates(prop)
	}
	if items, ok := schema["items"].(map[string]any); ok {
		constrainPodTemplates(items)
	}
}

// dig returns the value at path in nested maps, nil where there is none.
func dig(v any, path ...string) any {
	for _, key := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[key]
	}
	return v
}
