// Package deploy holds Lifeline's manifests; this test applies them to a real API server and checks what the
// identities they create may and may not do.
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/lifeline-edge/lifeline/test/cluster"
)

var controlPlane *cluster.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{WithoutControllerManager: true, WithoutScheduler: true, CRDDirs: []string{"crds"}},
		func(cp *cluster.ControlPlane) error { controlPlane = cp; return nil }))
}

// applyDir server-side applies every object of every YAML file in dir, as kubectl apply --server-side does.
func applyDir(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(controlPlane.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn := dynamic.NewForConfigOrDie(controlPlane.Config)
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	var applied []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			obj := &unstructured.Unstructured{}
			if err := dec.Decode(&obj.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s: %v", f, gvk, err)
			}
			body, _ := json.Marshal(obj.Object)
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if obj.GetNamespace() != "" {
				ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			force := true
			if _, err := ri.Patch(context.Background(), obj.GetName(), "application/apply-patch+yaml", body,
				metav1.PatchOptions{FieldManager: "lifeline-install", Force: &force}); err != nil {
				t.Fatalf("applying %s %s from %s: %v", gvk.Kind, obj.GetName(), f, err)
			}
			applied = append(applied, obj)
		}
	}
	return applied
}

func TestManifestsApplyWithLeastPrivilege(t *testing.T) {
	cluster.SkipIfShort(t)
	objs := append(applyDir(t, "controller"), applyDir(t, "agent")...)
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		data, _ := json.Marshal(o.Object)
		var role rbacv1.ClusterRole
		_ = json.Unmarshal(data, &role)
		for _, r := range role.Rules {
			for _, list := range [][]string{r.Verbs, r.Resources, r.APIGroups} {
				for _, v := range list {
					if v == "*" {
						t.Errorf("%s %s grants a wildcard: %+v", o.GetKind(), o.GetName(), r)
					}
				}
			}
		}
	}

	client := kubernetes.NewForConfigOrDie(controlPlane.Config)
	can := func(user, verb, group, resource, subresource, namespace string) bool {
		sar, err := client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:lifeline-system", "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource,
					Subresource: subresource, Namespace: namespace}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	controller := "system:serviceaccount:lifeline-system:lifeline-controller"
	agent := "system:serviceaccount:lifeline-system:lifeline-agent"
	cases := []struct {
		user, verb, group, resource, subresource, namespace string
		want                                                bool
	}{
		{controller, "create", "apps", "deployments", "", "default", true},
		{controller, "update", "sedna.io", "federatedlearningjobs", "status", "default", true},
		{controller, "patch", "", "pods", "", "team-a", true},
		{controller, "delete", "sedna.io", "federatedlearningjobs", "", "default", true},
		{controller, "watch", "", "secrets", "", "default", true},
		{controller, "update", "coordination.k8s.io", "leases", "", "lifeline-system", true},
		{controller, "create", "", "secrets", "", "default", false},
		{controller, "update", "coordination.k8s.io", "leases", "", "kube-system", false},
		{controller, "delete", "", "nodes", "", "", false},
		{controller, "watch", "", "nodes", "", "", true},
		{controller, "update", "sedna.io", "models", "", "default", false},
		{agent, "list", "", "pods", "", "", true},
		{agent, "create", "", "pods", "", "default", false},
		{agent, "get", "", "secrets", "", "default", false},
	}
	for _, tc := range cases {
		if got := can(tc.user, tc.verb, tc.group, tc.resource, tc.subresource, tc.namespace); got != tc.want {
			t.Errorf("%s may %s %s/%s %s in %q: %v, want %v", tc.user, tc.verb, tc.group, tc.resource, tc.subresource, tc.namespace, got, tc.want)
		}
	}
}
