// Package deploy holds Lifeline's manifests; this test applies them to a real API server and checks what the
// identities they create may and may not do.
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
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

// readDir decodes every object of every YAML file in dir.
func readDir(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	var objs []*unstructured.Unstructured
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
			if len(obj.Object) > 0 {
				objs = append(objs, obj)
			}
		}
	}
	return objs
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
	objs := readDir(t, dir)
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, gvk, err)
		}
		body, _ := json.Marshal(obj.Object)
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if obj.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		force := true
		if _, err := ri.Patch(context.Background(), obj.GetName(), "application/apply-patch+yaml", body,
			metav1.PatchOptions{FieldManager: "lifeline-install", Force: &force}); err != nil {
			t.Fatalf("applying %s %s from %s: %v", gvk.Kind, obj.GetName(), dir, err)
		}
	}
	return objs
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
		{controller, "update", "", "secrets", "", "default", false},
		{controller, "delete", "", "secrets", "", "default", false},
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

// controllerManifests returns the controller's Deployment and NetworkPolicy as typed objects.
func controllerManifests(t *testing.T, objs []*unstructured.Unstructured) (*appsv1.Deployment, *networkingv1.NetworkPolicy) {
	t.Helper()
	var d *appsv1.Deployment
	var np *networkingv1.NetworkPolicy
	for _, o := range objs {
		var into any
		switch {
		case o.GetKind() == "Deployment" && o.GetName() == "lifeline-controller":
			d = &appsv1.Deployment{}
			into = d
		case o.GetKind() == "NetworkPolicy" && o.GetName() == "lifeline-controller":
			np = &networkingv1.NetworkPolicy{}
			into = np
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, into, true); err != nil {
			t.Fatalf("%s %s does not parse: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if d == nil || np == nil {
		t.Fatalf("deploy/controller must hold the lifeline-controller Deployment and NetworkPolicy (found %v, %v)", d != nil, np != nil)
	}
	return d, np
}

// TestControllerRunsConfined: the controller runs with the runtime's seccomp profile, without capabilities or
// privilege escalation, serves plain-HTTP metrics on loopback only, and its NetworkPolicy — accepted by the API
// server as written — lets in only the MQTT port and lets out only the API server's ports.
func TestControllerRunsConfined(t *testing.T) {
	d, np := controllerManifests(t, readDir(t, "controller"))
	pod := d.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod securityContext %+v, want runAsNonRoot and seccompProfile RuntimeDefault", sc)
	}
	mqttPort := intstr.FromInt32(0)
	for _, c := range pod.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil ||
			!*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
			len(sc.Capabilities.Add) != 0 || (sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("container %s securityContext %+v, want no privilege escalation, a read-only root and every capability dropped", c.Name, sc)
		}
		metrics := ""
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
				metrics = v
			}
		}
		if host, _, err := net.SplitHostPort(metrics); metrics != "0" && (err != nil || !net.ParseIP(host).IsLoopback()) {
			t.Errorf("container %s serves metrics at %q: plain HTTP must stay on loopback (or be off)", c.Name, metrics)
		}
		for _, p := range c.Ports {
			if p.Name == "mqtts" {
				mqttPort = intstr.FromInt32(p.ContainerPort)
			}
		}
	}
	if mqttPort.IntVal == 0 {
		t.Fatal("the controller exposes no mqtts port")
	}

	if !equality.Semantic.DeepEqual(np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("NetworkPolicy selects %v, the controller's pods are %v", np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels)
	}
	types := map[networkingv1.PolicyType]bool{}
	for _, pt := range np.Spec.PolicyTypes {
		types[pt] = true
	}
	if !types[networkingv1.PolicyTypeIngress] || !types[networkingv1.PolicyTypeEgress] {
		t.Errorf("policyTypes %v, want both Ingress and Egress confined", np.Spec.PolicyTypes)
	}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			t.Errorf("ingress rule %+v opens every port", rule)
		}
		for _, p := range rule.Ports {
			if p.Port == nil || *p.Port != mqttPort {
				t.Errorf("ingress opens port %v; only MQTT (%v) is to be reached from outside the pod", p.Port, mqttPort.IntVal)
			}
		}
	}
	if len(np.Spec.Ingress) == 0 {
		t.Error("no ingress rule: edge agents could not reach the broker")
	}
	egress := map[int32]bool{}
	for _, rule := range np.Spec.Egress {
		if len(rule.Ports) == 0 {
			t.Errorf("egress rule %+v opens every port", rule)
		}
		for _, p := range rule.Ports {
			if p.Port != nil {
				egress[p.Port.IntVal] = true
			}
		}
	}
	if !egress[443] || !egress[6443] || len(egress) != 2 {
		t.Errorf("egress ports %v, want the API server's: 443 and 6443", egress)
	}

	cluster.SkipIfShort(t)
	applyDir(t, "controller")
	got, err := kubernetes.NewForConfigOrDie(controlPlane.Config).NetworkingV1().NetworkPolicies(np.Namespace).
		Get(context.Background(), np.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the NetworkPolicy did not reach the API server: %v", err)
	}
	if !equality.Semantic.DeepEqual(got.Spec.Ingress, np.Spec.Ingress) || !equality.Semantic.DeepEqual(got.Spec.Egress, np.Spec.Egress) {
		t.Errorf("the API server holds another policy than written:\n got %+v\nwant %+v", got.Spec, np.Spec)
	}
}
