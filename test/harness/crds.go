package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// InstallCRDs applies every CustomResourceDefinition in the YAML files of dir (server-side apply, field manager
// "lifeline-test") and waits until each is Established, so a test can create resources of it right away.
func InstallCRDs(ctx context.Context, cfg *rest.Config, dir string) error {
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building apiextensions client: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRD files in %s (%v)", dir, err)
	}
	var names []string
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("reading %s: %w", file, err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			return fmt.Errorf("decoding %s: %w", file, err)
		}
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		patch, err := yaml.ToJSON(data)
		if err != nil {
			return fmt.Errorf("converting %s to JSON: %w", file, err)
		}
		_, err = client.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd.Name, "application/apply-patch+yaml",
			patch, metav1.PatchOptions{FieldManager: "lifeline-test", Force: ptr.To(true)})
		if err != nil {
			return fmt.Errorf("applying CRD %s from %s: %w", crd.Name, file, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		if err := WaitEstablished(ctx, client, name); err != nil {
			return err
		}
	}
	return nil
}

// WaitEstablished waits up to 30 s for the CRD name to be Established: its resources are served.
func WaitEstablished(ctx context.Context, client apiextensionsclient.Interface, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true,
		func(ctx context.Context) (bool, error) {
			crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be established: %w", name, err)
	}
	return nil
}
