package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// InstallPolicies creates every ValidatingAdmissionPolicy and binding of the YAML files, leaving their other
// objects out, then waits until the API server enforces the FederatedLearningJob's: it loads policies
// asynchronously, and a test that edits a job right away would otherwise see the edit taken.
func InstallPolicies(ctx context.Context, cfg *rest.Config, files ...string) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	for _, file := range files {
		if err := createPolicies(ctx, kube, file); err != nil {
			return err
		}
	}
	return waitEnforced(ctx, cfg)
}

func createPolicies(ctx context.Context, kube kubernetes.Interface, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading %s: %w", file, err)
	}
	docs := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading %s: %w", file, err)
		}
		var kind metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			return fmt.Errorf("decoding %s: %w", file, err)
		}
		switch kind.Kind {
		case "ValidatingAdmissionPolicy":
			p := &admissionv1.ValidatingAdmissionPolicy{}
			if err = yaml.Unmarshal(doc, p); err == nil {
				_, err = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{})
			}
		case "ValidatingAdmissionPolicyBinding":
			b := &admissionv1.ValidatingAdmissionPolicyBinding{}
			if err = yaml.Unmarshal(doc, b); err == nil {
				_, err = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		default:
			continue
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating a %s of %s: %w", kind.Kind, file, err)
		}
	}
}

// waitEnforced creates a FederatedLearningJob and edits its workers, dry run, until the API server refuses the
// edit; then deletes it. It runs before any controller, which never sees the job.
func waitEnforced(ctx context.Context, cfg *rest.Config) error {
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	jobs := client.Resource(schema.GroupVersionResource{Group: "sedna.io", Version: "v1alpha1", Resource: "federatedlearningjobs"}).
		Namespace(metav1.NamespaceDefault)
	template := map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "w", "image": "probe"}}}}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "sedna.io/v1alpha1", "kind": "FederatedLearningJob",
		"metadata": map[string]any{"name": "lifeline-policy-probe"},
		"spec": map[string]any{
			"aggregationWorker": map[string]any{"model": map[string]any{"name": "m"}, "template": template},
			"trainingWorkers":   []any{map[string]any{"dataset": map[string]any{"name": "d"}, "template": template}},
		},
	}}
	created, err := jobs.Create(ctx, probe, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the policy probe: %w", err)
	}
	defer func() { _ = jobs.Delete(context.WithoutCancel(ctx), created.GetName(), metav1.DeleteOptions{}) }() // nothing else saw it
	edited := created.DeepCopy()
	if err := unstructured.SetNestedField(edited.Object, "other", "spec", "aggregationWorker", "model", "name"); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := jobs.Update(ctx, edited, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "is immutable"), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the admission policies to be enforced: %w", err)
	}
	return nil
}
