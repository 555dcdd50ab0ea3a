// Package deploy holds Lifeline's manifests; this test applies them to a real API server and checks what the
// identities they create may and may not do.
package deploy

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"os"
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
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/lifeline-edge/lifeline/test/harness"
)

var controlPlane *harness.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(harness.RunTests(m, harness.ControlPlaneOptions{WithoutControllerManager: true, WithoutScheduler: true, CRDDirs: []string{"crds"}},
		func(cp *harness.ControlPlane) error { controlPlane = cp; return nil }))
}

// applyObjects server-side applies objs, as kubectl apply --server-side does.
func applyObjects(t *testing.T, source string, objs []*unstructured.Unstructured) {
	t.Helper()
	forEachResource(t, objs, func(ri dynamic.ResourceInterface, obj *unstructured.Unstructured) {
		body, _ := json.Marshal(obj.Object)
		force := true
		if _, err := ri.Patch(context.Background(), obj.GetName(), "application/apply-patch+yaml", body,
			metav1.PatchOptions{FieldManager: "lifeline-install", Force: &force}); err != nil {
			t.Fatalf("applying %s %s from %s: %v", obj.GetKind(), obj.GetName(), source, err)
		}
	})
}

// forEachResource calls do with each object and the test API server's client of its resource.
func forEachResource(t *testing.T, objs []*unstructured.Unstructured, do func(dynamic.ResourceInterface, *unstructured.Unstructured)) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(controlPlane.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn := dynamic.NewForConfigOrDie(controlPlane.Config)
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if obj.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		do(ri, obj)
	}
}

// helmOnControlPlane runs helm against the test's API server.
func helmOnControlPlane(t *testing.T, args ...string) {
	t.Helper()
	if out, err := runHelm(t, append(args, "--kubeconfig", controlPlane.Kubeconfig)...); err != nil {
		t.Fatalf("helm %v: %v\n%s", args, err, out)
	}
}

// brokerTLS reads the broker's certificate from the API server, and the CA the agents are given.
func brokerTLS(t *testing.T, client kubernetes.Interface) (*x509.Certificate, []byte, string) {
	t.Helper()
	s, err := client.CoreV1().Secrets(namespace).Get(context.Background(), "lifeline-broker-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(context.Background(), "lifeline-broker-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(s.Data["tls.crt"])
	if block == nil {
		t.Fatalf("tls.crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert, s.Data["tls.crt"], cm.Data["ca.crt"]
}

// verifiesFor says whether an agent given caPEM and dialling addr accepts cert.
func verifiesFor(cert *x509.Certificate, caPEM, addr string) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(caPEM)) {
		return errors.New("no CA certificate")
	}
	_, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: addr, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// TestInstall installs the chart with helm on a real API server, upgrades it, and checks what the identities it
// creates may and may not do; then it does the same with the plain manifests, server-side applied.
func TestInstall(t *testing.T) {
	harness.SkipIfShort(t)
	client := kubernetes.NewForConfigOrDie(controlPlane.Config)
	kubeedgeCA, _ := testCA(t, "kubeedge")
	install := func(address string) {
		t.Helper()
		helmOnControlPlane(t, "upgrade", "--install", "lifeline", chartDir, "--namespace", namespace, "--create-namespace",
			"--set-file", "nodeIdentity.kubeedgeCA="+kubeedgeCA, "--set", "broker.advertiseAddress={"+address+"}", "--set", "broker.tls.generatedBy=helm")
	}
	podTemplate := func() map[string]string {
		d, err := client.AppsV1().Deployments(namespace).Get(context.Background(), "lifeline-controller", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Annotations
	}

	install("192.0.2.10")
	cert, certPEM, ca := brokerTLS(t, client)
	if err := verifiesFor(cert, ca, "192.0.2.10"); err != nil {
		t.Fatalf("installed: an agent dialling 192.0.2.10 refuses the broker: %v", err)
	}
	before := podTemplate()

	install("192.0.2.10")
	cert2, certPEM2, ca2 := brokerTLS(t, client)
	if !bytes.Equal(certPEM, certPEM2) || ca != ca2 {
		t.Errorf("an upgrade with the same addresses issued another certificate or CA (serials %v, %v)", cert.SerialNumber, cert2.SerialNumber)
	}
	if !equality.Semantic.DeepEqual(before, podTemplate()) {
		t.Errorf("an upgrade with the same values restarts the controller: %v, then %v", before, podTemplate())
	}

	install("192.0.2.20")
	cert3, _, ca3 := brokerTLS(t, client)
	if ca3 != ca {
		t.Error("a new advertised address replaced the CA: every agent would refuse the broker")
	}
	if err := verifiesFor(cert3, ca3, "192.0.2.20"); err != nil {
		t.Errorf("after a new advertised address, an agent dialling it refuses the broker: %v", err)
	}
	if equality.Semantic.DeepEqual(before, podTemplate()) {
		t.Error("a new certificate does not restart the controller, which loads it at start")
	}
	checkRBAC(t, client, "the chart")

	// No pod runs on this control plane (it has no nodes), so the pre-delete Job could never finish: its parts,
	// StopDeployment and ReleaseFinalizers, are tested in cloud/federatedlearning.
	helmOnControlPlane(t, "uninstall", "lifeline", "--namespace", namespace, "--no-hooks")
	if _, err := client.RbacV1().ClusterRoles().Get(context.Background(), "lifeline-controller", metav1.GetOptions{}); err == nil {
		t.Error("helm uninstall left the controller's ClusterRole")
	}
	manifests := readManifests(t)
	applyObjects(t, manifestsFile, manifests)
	checkRBAC(t, client, manifestsFile)
	checkNoWildcards(t, manifests)
	checkNoWildcards(t, renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+kubeedgeCA))
}

func checkNoWildcards(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
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
}

// checkRBAC asks the API server what the installed identities may do.
func checkRBAC(t *testing.T, client kubernetes.Interface, installedBy string) {
	t.Helper()
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
		{controller, "update", "apps", "deployments", "", "lifeline-system", true}, // release --stop-deployment
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
		{agent, "list", "", "pods", "", "", false}, // no token mounted: agent.edgecore.requireAuthorization
		{agent, "create", "", "pods", "", "default", false},
		{agent, "get", "", "secrets", "", "default", false},
		{agent, "get", "", "configmaps", "", "lifeline-system", false},
	}
	for _, tc := range cases {
		if got := can(tc.user, tc.verb, tc.group, tc.resource, tc.subresource, tc.namespace); got != tc.want {
			t.Errorf("installed by %s, %s may %s %s/%s %s in %q: %v, want %v", installedBy, tc.user, tc.verb, tc.group, tc.resource,
				tc.subresource, tc.namespace, got, tc.want)
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
		t.Fatalf("no lifeline-controller Deployment and NetworkPolicy (found %v, %v)", d != nil, np != nil)
	}
	return d, np
}

// TestControllerRunsConfined: the controller runs with the runtime's seccomp profile, without capabilities or
// privilege escalation, serves plain-HTTP metrics on loopback only, and its NetworkPolicy — accepted by the API
// server as written — lets in only the MQTT port and lets out only the API server's ports.
func TestControllerRunsConfined(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	plain := readManifests(t)
	for name, objs := range map[string][]*unstructured.Unstructured{
		manifestsFile: plain,
		"the chart":   renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile),
		"the chart on port 8884": renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile, "--set", "broker.port=8884",
			"--set", "broker.service.type=LoadBalancer"),
	} {
		t.Run(name, func(t *testing.T) { checkControllerConfined(t, objs) })
	}

	harness.SkipIfShort(t)
	_, np := controllerManifests(t, plain)
	applyObjects(t, manifestsFile, []*unstructured.Unstructured{plain[0], findObject(t, plain, "NetworkPolicy", np.Name)})
	got, err := kubernetes.NewForConfigOrDie(controlPlane.Config).NetworkingV1().NetworkPolicies(np.Namespace).
		Get(context.Background(), np.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the NetworkPolicy did not reach the API server: %v", err)
	}
	if !equality.Semantic.DeepEqual(got.Spec.Ingress, np.Spec.Ingress) || !equality.Semantic.DeepEqual(got.Spec.Egress, np.Spec.Egress) {
		t.Errorf("the API server holds another policy than written:\n got %+v\nwant %+v", got.Spec, np.Spec)
	}
}

func findObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

func checkControllerConfined(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	d, np := controllerManifests(t, objs)
	pod := d.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod securityContext %+v, want runAsNonRoot and seccompProfile RuntimeDefault", sc)
	}
	mqttPort, metricsPort := intstr.FromInt32(0), intstr.FromInt32(0)
	for _, c := range pod.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil ||
			!*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
			len(sc.Capabilities.Add) != 0 || (sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("container %s securityContext %+v, want no privilege escalation, a read-only root and every capability dropped", c.Name, sc)
		}
		metrics, secure := "", false
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
				metrics = v
			}
			secure = secure || a == "--metrics-secure"
		}
		if host, _, err := net.SplitHostPort(metrics); metrics != "0" && !secure && (err != nil || !net.ParseIP(host).IsLoopback()) {
			t.Errorf("container %s serves metrics at %q: plain HTTP must stay on loopback (or be off)", c.Name, metrics)
		}
		for _, p := range c.Ports {
			switch p.Name {
			case "mqtts":
				mqttPort = intstr.FromInt32(p.ContainerPort)
			case "metrics":
				if !secure {
					t.Errorf("container %s exposes its plain-HTTP metrics as a port", c.Name)
				}
				metricsPort = intstr.FromInt32(p.ContainerPort)
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
			if p.Port == nil || (*p.Port != mqttPort && (metricsPort.IntVal == 0 || *p.Port != metricsPort)) {
				t.Errorf("ingress opens port %v; only MQTT (%v) and authenticated metrics are to be reached from outside the pod", p.Port, mqttPort.IntVal)
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
}
