package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

const controllerUser = "system:serviceaccount:" + namespace + ":lifeline-controller"

// grant is one verb on one resource that a rendered Role or ClusterRole gives, and where.
type grant struct {
	kind, name, namespace string
	verb                  string
}

// grantsOn lists every verb the rendered Roles and ClusterRoles give on resource of the core group.
func grantsOn(t *testing.T, objs []*unstructured.Unstructured, resource string) []grant {
	t.Helper()
	var out []grant
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		role := mustObject[rbacv1.ClusterRole](t, []*unstructured.Unstructured{o}, o.GetKind(), o.GetName())
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, resource) {
				for _, v := range r.Verbs {
					out = append(out, grant{o.GetKind(), o.GetName(), o.GetNamespace(), v})
				}
			}
		}
	}
	return out
}

// boundTo says whether a RoleBinding of that name in ns binds the Role of the same name to the service account.
func boundTo(t *testing.T, objs []*unstructured.Unstructured, ns, name, account string) bool {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" || o.GetName() != name || o.GetNamespace() != ns {
			continue
		}
		rb := mustObject[rbacv1.RoleBinding](t, []*unstructured.Unstructured{o}, "RoleBinding", name)
		return rb.RoleRef.Kind == "Role" && rb.RoleRef.Name == name && slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == account && s.Namespace == namespace
		})
	}
	return false
}

// A stolen controller token must not open KubeEdge's CA key (kubeedge/casecret) nor any Secret outside the
// workloads' namespaces: with controller.namespaces, no ClusterRole names Secrets, a Role in each of those
// namespaces grants what the controller's metadata cache does (get, list, watch), and the controller, run with
// exactly those rights, still reconciles a workload whose Model needs a credential Secret.
func TestStolenControllerTokenCannotReadKubeEdgesSecrets(t *testing.T) {
	scoped := []string{"--set", "nodeIdentity.mode=password", "--set", "controller.namespaces={team-a,team-b}"}
	objs := renderChart(t, scoped...)
	var inNamespaces []string
	for _, g := range grantsOn(t, objs, "secrets") {
		switch {
		case g.kind == "ClusterRole":
			t.Errorf("ClusterRole %s grants %s on every Secret of the cluster", g.name, g.verb)
		case g.name == "lifeline-controller-broker-tls" && g.namespace == namespace && g.verb == "create":
			// It makes the broker's CA once: create reads nothing, and the CA's key is read from its mount.
		case g.name != "lifeline-controller-credentials" || (g.namespace != "team-a" && g.namespace != "team-b"):
			t.Errorf("Role %s/%s grants %s on Secrets, outside the workloads' namespaces", g.namespace, g.name, g.verb)
		default:
			inNamespaces = append(inNamespaces, g.namespace+":"+g.verb)
		}
	}
	slices.Sort(inNamespaces)
	if want := []string{"team-a:get", "team-a:list", "team-a:watch", "team-b:get", "team-b:list", "team-b:watch"}; !slices.Equal(inNamespaces, want) {
		t.Errorf("Secrets readable as %v, want %v: the controller's cache of their metadata could not start", inNamespaces, want)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if !boundTo(t, objs, ns, "lifeline-controller-credentials", "lifeline-controller") {
			t.Errorf("no RoleBinding gives the controller's account the Role lifeline-controller-credentials in %s", ns)
		}
	}
	c := mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec.Containers[0]
	if got, _ := flag(c.Args, "namespaces"); got != "team-a,team-b" {
		t.Errorf("controller --namespaces=%q, want team-a,team-b: it would watch Secrets it may not read", got)
	}

	// Every namespace is the default: then, and only then, the cluster-wide rule is there, as values.yaml says.
	everywhere := renderChart(t, "--set", "nodeIdentity.mode=password")
	if g := slices.DeleteFunc(grantsOn(t, everywhere, "secrets"), func(g grant) bool { return g.verb == "create" }); len(g) != 3 || g[0].kind != "ClusterRole" {
		t.Errorf("without controller.namespaces, Secrets are granted as %v, want get, list and watch in the controller's ClusterRole", g)
	}
	if c := mustObject[appsv1.Deployment](t, everywhere, "Deployment", "lifeline-controller").Spec.Template.Spec.Containers[0]; slices.ContainsFunc(c.Args,
		func(a string) bool { return strings.HasPrefix(a, "--namespaces") }) {
		t.Errorf("controller args %v: --namespaces without controller.namespaces", c.Args)
	}

	harness.SkipIfShort(t)
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(controlPlane.Config)
	for _, ns := range []string{namespace, "team-a", "team-b", "kubeedge"} {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	var rbac []*unstructured.Unstructured
	for _, o := range objs {
		if strings.HasPrefix(o.GetAPIVersion(), "rbac.authorization.k8s.io/") {
			rbac = append(rbac, o)
		}
	}
	applyObjects(t, "the chart with controller.namespaces", rbac)
	t.Cleanup(func() { deleteObjects(t, rbac) })

	can := func(verb, ns, name string) bool {
		sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: controllerUser,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: "secrets", Namespace: ns, Name: name}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	for _, tc := range []struct {
		verb, ns, name string
		want           bool
	}{
		{"get", "kubeedge", "casecret", false},
		{"list", "kubeedge", "", false},
		{"list", "", "", false},
		{"watch", "", "", false},
		{"get", namespace, "lifeline-broker-ca-key", false},
		{"get", "default", "s3-cred", false},
		{"watch", "team-a", "", true},
		{"list", "team-b", "", true},
		{"get", "team-a", "s3-cred", true},
		{"update", "team-a", "s3-cred", false},
	} {
		if got := can(tc.verb, tc.ns, tc.name); got != tc.want {
			t.Errorf("the controller may %s Secret %q in %q: %v, want %v", tc.verb, tc.name, tc.ns, got, tc.want)
		}
	}

	// The controller as its service account, with the rendered rules alone: its cache starts, and it reads the
	// credential's metadata to render a worker that takes the keys by reference.
	ctrllog.SetLogger(logr.Discard()) // what the test needs of it, it asserts
	cfg := rest.CopyConfig(controlPlane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	mgr, err := manager.New(cfg, manager.Options{MetricsAddr: "0", HealthAddr: "0", Restartable: true, Namespaces: []string{"team-a", "team-b"}})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	admin, err := client.New(controlPlane.Config, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	ji := &v1alpha1.JointInferenceService{}
	if err := testkit.LoadObject("joint-inference.yaml", testkit.DefaultVars, ji); err != nil {
		t.Fatal(err)
	}
	ji.Namespace = "team-a"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ji.Namespace, Name: "s3-cred",
		Annotations: map[string]string{contract.AnnotationS3Endpoint: "minio.storage:9000"}},
		StringData: map[string]string{contract.EnvAccessKeyID: "a", contract.EnvSecretAccessKey: "s"}}
	objects := []client.Object{secret}
	for _, m := range []string{ji.Spec.EdgeWorker.Model.Name, ji.Spec.CloudWorker.Model.Name} {
		objects = append(objects, &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ji.Namespace, Name: m},
			Spec: v1alpha1.ModelSpec{URL: "s3://models/" + m + ".pb", Format: "pb", CredentialName: secret.Name}})
	}
	for _, o := range append(objects, ji) {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Delete(ctx, o) })
	}
	testkit.Every(t, 200*time.Millisecond, 60*time.Second, "with the chart's rules, the Deployments reading Secret "+secret.Name+" by reference",
		func(ctx context.Context) (bool, error) {
			list := &appsv1.DeploymentList{}
			if err := admin.List(ctx, list, client.InNamespace(ji.Namespace)); err != nil {
				return false, err
			}
			byReference := 0
			for _, d := range list.Items {
				for _, c := range d.Spec.Template.Spec.InitContainers {
					if slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
						return e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == secret.Name
					}) {
						byReference++
					}
				}
			}
			if byReference != 2 {
				return false, fmt.Errorf("the controller rendered %d Deployments, %d reading Secret %s: it could not read what it needs",
					len(list.Items), byReference, secret.Name)
			}
			return true, nil
		})
}

// deleteObjects deletes objs from the test's API server, so the cluster-wide ones do not outlive the test.
func deleteObjects(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	forEachResource(t, objs, func(ri dynamic.ResourceInterface, obj *unstructured.Unstructured) {
		if err := ri.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	})
}

// A node certificate that leaked can be revoked with the chart: broker.revokedCertificates mounts the ConfigMap's
// key as a file the broker reads again when it changes (a directory mount: a subPath would never change), and
// passes it as --mqtt-revoked-certificates-file.
func TestLeakedNodeCertificateCanBeRevokedWithTheChart(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	objs := renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile,
		"--set", "broker.revokedCertificates.configMap=lifeline-revoked", "--set", "broker.revokedCertificates.key=revoked.txt")
	pod := mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec
	c := pod.Containers[0]
	file, ok := flag(c.Args, "mqtt-revoked-certificates-file")
	if !ok {
		t.Fatalf("controller args %v: no --mqtt-revoked-certificates-file, every leaked certificate stays admitted", c.Args)
	}
	v, m, mounted := mountedFrom(pod, c, file)
	switch {
	case !mounted || v.ConfigMap == nil || v.ConfigMap.Name != "lifeline-revoked":
		t.Errorf("%s comes from %+v, want the ConfigMap lifeline-revoked", file, v)
	case !m.ReadOnly || m.SubPath != "":
		t.Errorf("mount %+v: want read-only and no subPath, so edits of the list reach the broker", m)
	case len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Key != "revoked.txt" || path.Join(m.MountPath, v.ConfigMap.Items[0].Path) != file:
		t.Errorf("ConfigMap items %+v at %s: want key revoked.txt at %s", v.ConfigMap.Items, m.MountPath, file)
	case v.ConfigMap.Optional != nil && *v.ConfigMap.Optional:
		t.Error("the list is optional: without it the broker refuses every node, so the pod must wait for it")
	}

	c = mustObject[appsv1.Deployment](t, renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile), "Deployment",
		"lifeline-controller").Spec.Template.Spec.Containers[0]
	if _, ok := flag(c.Args, "mqtt-revoked-certificates-file"); ok {
		t.Errorf("controller args %v: a revocation list nobody gave, which would refuse every node", c.Args)
	}
}

// A token stolen from an edge node's agent pod must not list the cluster's pods: the agent sends its token only
// to a MetaServer under requireAuthorization, so only agent.edgecore.requireAuthorization mounts one and grants
// it a role; by default the pod has no token and the agent no rule.
func TestStolenAgentTokenListsNoPods(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	for name, objs := range map[string][]*unstructured.Unstructured{
		manifestsFile: readManifests(t),
		"the chart":   renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile),
	} {
		t.Run(name, func(t *testing.T) {
			pod := mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent").Spec.Template.Spec
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Errorf("automountServiceAccountToken %v: every edge node holds a token the agent never sends", pod.AutomountServiceAccountToken)
			}
			for _, o := range objs {
				if strings.HasPrefix(o.GetAPIVersion(), "rbac.authorization.k8s.io/") && o.GetName() == "lifeline-agent" {
					t.Errorf("%s lifeline-agent rendered for an agent without a token", o.GetKind())
				}
			}
			if _, _, ok := mountedFrom(pod, pod.Containers[0], "/etc/kubeedge/pki/metaserver/ca.crt"); ok {
				t.Error("the MetaServer's CA is mounted without requireAuthorization")
			}
		})
	}

	objs := renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile, "--set", "agent.edgecore.requireAuthorization=true")
	pod := mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent").Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Error("under requireAuthorization the agent has no token for the MetaServer")
	}
	v, m, ok := mountedFrom(pod, pod.Containers[0], "/etc/kubeedge/pki/metaserver/ca.crt")
	if !ok || v.HostPath == nil || v.HostPath.Path != "/etc/kubeedge/pki/metaserver" || !m.ReadOnly {
		t.Errorf("the MetaServer's CA comes from %+v, want the node's /etc/kubeedge/pki/metaserver, read only", v)
	}
	role := mustObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "lifeline-agent")
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, want[0].Resources) || !slices.Equal(role.Rules[0].Verbs, want[0].Verbs) ||
		!slices.Equal(role.Rules[0].APIGroups, want[0].APIGroups) {
		t.Errorf("the agent's ClusterRole grants %+v, want reading pods alone", role.Rules)
	}
	binding := mustObject[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "lifeline-agent")
	if binding.RoleRef.Name != "lifeline-agent" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "lifeline-agent" {
		t.Errorf("ClusterRoleBinding %+v, want lifeline-agent's account bound to its role", binding)
	}
}

// Dataset counting reads the node's index files, not the agent's own container, and only under the node
// directories agent.datasetDirs lists: each is mounted read-only under --host-root, the node's root never.
func TestAgentCountsDatasetsOnlyInListedNodeDirectories(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	hostRoot := func(c corev1.Container) string {
		root, ok := flag(c.Args, "host-root")
		if !ok || root == "" || root == "/" {
			t.Fatalf("agent --host-root=%q: Datasets would be counted in the agent's own container", root)
		}
		return root
	}

	pod := mustObject[appsv1.DaemonSet](t, renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile), "DaemonSet",
		"lifeline-agent").Spec.Template.Spec
	root := hostRoot(pod.Containers[0])
	for _, m := range pod.Containers[0].VolumeMounts {
		if m.MountPath == root || strings.HasPrefix(m.MountPath, root+"/") {
			t.Errorf("by default %s is mounted at %s, under the host root", m.Name, m.MountPath)
		}
	}

	pod = mustObject[appsv1.DaemonSet](t, renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile,
		"--set", "agent.datasetDirs={/data,/srv/datasets}"), "DaemonSet", "lifeline-agent").Spec.Template.Spec
	c := pod.Containers[0]
	root = hostRoot(c)
	var under []string
	for _, m := range c.VolumeMounts {
		if m.MountPath != root && !strings.HasPrefix(m.MountPath, root+"/") {
			continue
		}
		under = append(under, m.MountPath)
		v, _, _ := mountedFrom(pod, c, m.MountPath)
		if v.HostPath == nil || root+v.HostPath.Path != m.MountPath || !m.ReadOnly ||
			(m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone) {
			t.Errorf("%s is %+v from %+v: want the node directory of the same path, read only, without propagation", m.MountPath, m, v.HostPath)
		}
	}
	slices.Sort(under)
	if want := []string{root + "/data", root + "/srv/datasets"}; !slices.Equal(under, want) {
		t.Errorf("under the host root %s: %v, want %v", root, under, want)
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/" {
			t.Errorf("volume %s mounts the node's root", v.Name)
		}
	}
}

// Item 6 of the third hardening round: RBAC gives the controller's token `patch nodes/status` on every Node and
// every field of it. The chart's admission policy holds that token to what the controller writes: the
// LifelineAgent condition of edge Nodes. Asked of the real API server, as the controller's account.
func TestStolenControllerTokenWritesOnlyTheLifelineConditionOfEdgeNodes(t *testing.T) {
	harness.SkipIfShort(t)
	ctx := context.Background()
	var installed []*unstructured.Unstructured
	for _, o := range renderChart(t, "--set", "nodeIdentity.mode=password") {
		if strings.HasPrefix(o.GetAPIVersion(), "rbac.authorization.k8s.io/") || o.GetName() == "lifeline-controller-node-status" {
			installed = append(installed, o)
		}
	}
	admin := kubernetes.NewForConfigOrDie(controlPlane.Config)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	applyObjects(t, "the chart", installed)
	t.Cleanup(func() { deleteObjects(t, installed) })

	for name, labels := range map[string]map[string]string{"vap-edge-1": {"node-role.kubernetes.io/edge": ""}, "vap-cloud-1": nil} {
		node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
		node.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) })
	}

	cfg := rest.CopyConfig(controlPlane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	stolen := kubernetes.NewForConfigOrDie(cfg)
	patch := func(node, status string) error {
		_, err := stolen.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(`{"status":`+status+`}`),
			metav1.PatchOptions{}, "status")
		return err
	}
	lifeline := `{"conditions":[{"type":"LifelineAgent","status":"True","reason":"Connected","message":"m"}]}`
	testkit.Until(t, 20*time.Second, "the policy in force", func() bool { return patch("vap-cloud-1", lifeline) != nil })
	if err := patch("vap-edge-1", lifeline); err != nil {
		t.Errorf("the controller's own write, its condition on an edge Node: %v", err)
	}
	for _, tc := range []struct{ node, status, message string }{
		{"vap-cloud-1", lifeline, "edge Nodes only"},
		{"vap-edge-1", `{"conditions":[{"type":"Ready","status":"False","reason":"Stolen"}]}`, "no Node condition but LifelineAgent"},
		{"vap-edge-1", `{"capacity":{"cpu":"64"}}`, "status.capacity"},
		{"vap-edge-1", `{"addresses":[{"type":"InternalIP","address":"10.6.6.6"}]}`, "status.addresses"},
		{"vap-edge-1", `{"declaredFeatures":["Stolen"]}`, "status.declaredFeatures"},
	} {
		if err := patch(tc.node, tc.status); err == nil || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("patching %s's status with %s: %v, want a refusal saying %q", tc.node, tc.status, err, tc.message)
		}
	}
	// Metadata through the status subresource: an owner reference that does not resolve has the garbage
	// collector delete the Node, and its pods with it.
	for _, tc := range []struct{ meta, message string }{
		{`{"ownerReferences":[{"apiVersion":"v1","kind":"Namespace","name":"default","uid":"00000000-0000-0000-0000-000000000001"}]}`, "ownerReferences"},
		{`{"finalizers":["example.com/stolen"]}`, "finalizers"},
		{`{"labels":{"stolen":"yes"}}`, "labels"},
	} {
		_, err := stolen.CoreV1().Nodes().Patch(ctx, "vap-edge-1", types.StrategicMergePatchType, []byte(`{"metadata":`+tc.meta+`}`),
			metav1.PatchOptions{}, "status")
		if err == nil || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("patching vap-edge-1's metadata with %s through its status: %v, want a refusal naming %s", tc.meta, err, tc.message)
		}
	}
	node, err := admin.CoreV1().Nodes().Get(ctx, "vap-edge-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cpu := node.Status.Capacity[corev1.ResourceCPU]; cpu.String() != "2" || len(node.Status.Addresses) != 0 ||
		len(node.OwnerReferences) != 0 || len(node.Finalizers) != 0 {
		t.Errorf("the edge Node was changed: capacity %v, addresses %v, owners %v, finalizers %v", node.Status.Capacity,
			node.Status.Addresses, node.OwnerReferences, node.Finalizers)
	}
}

// The node-status policy lists the fields it compares (CEL cannot compare a Node's status less its conditions):
// every field of corev1.NodeStatus of the API this is built with is among them, so a new one is not left open.
func TestNodeStatusPolicyComparesEveryField(t *testing.T) {
	var policy string
	for _, o := range renderChart(t, "--set", "nodeIdentity.mode=password") {
		if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "lifeline-controller-node-status" {
			data, _ := json.Marshal(o.Object)
			policy = string(data)
		}
	}
	fields := reflect.TypeOf(corev1.NodeStatus{})
	for i := range fields.NumField() {
		name, _, _ := strings.Cut(fields.Field(i).Tag.Get("json"), ",")
		if name != "conditions" && !strings.Contains(policy, "object.status."+name+" ==") {
			t.Errorf("the policy does not compare status.%s", name)
		}
	}
}

// Item 3 of the third hardening round, in part: the broker bounds the connections not yet logged in per source
// address, and with externalTrafficPolicy Cluster every agent and an attacker share the address of the node that
// forwarded them. A LoadBalancer keeps the agents' addresses (Local) by default; a NodePort, whose agents dial one
// node that may not run the controller, keeps Cluster unless told.
func TestBrokerServiceKeepsTheAgentsAddressesWhereItCan(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   corev1.ServiceExternalTrafficPolicy
	}{
		{[]string{"--set", "broker.service.type=LoadBalancer"}, corev1.ServiceExternalTrafficPolicyLocal},
		{nil, corev1.ServiceExternalTrafficPolicyCluster},
		{[]string{"--set", "broker.service.externalTrafficPolicy=Local"}, corev1.ServiceExternalTrafficPolicyLocal},
		{[]string{"--set", "broker.service.type=ClusterIP"}, ""},
	} {
		objs := renderChart(t, append([]string{"--set", "nodeIdentity.mode=password"}, tc.values...)...)
		if got := mustObject[corev1.Service](t, objs, "Service", "lifeline-broker").Spec.ExternalTrafficPolicy; got != tc.want {
			t.Errorf("%v: externalTrafficPolicy %q, want %q", tc.values, got, tc.want)
		}
	}
}
