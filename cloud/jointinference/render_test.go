package jointinference

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// fixtureJI loads the service of one of Lifeline's examples.
func fixtureJI(t *testing.T, file string) *v1alpha1.JointInferenceService {
	t.Helper()
	ji := &v1alpha1.JointInferenceService{}
	if err := testkit.LoadObject(file, testkit.DefaultVars, ji); err != nil {
		t.Fatal(err)
	}
	ji.UID = "ji-uid-1"
	return ji
}

func model(name, url string) *v1alpha1.Model {
	return &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.ModelSpec{URL: url, Format: "pb"}}
}

func testInputs(t *testing.T, file string) inputs {
	return inputs{
		ji:         fixtureJI(t, file),
		edgeModel:  model("little", "/models/little.pb"),
		cloudModel: model("big", "/models/big.pb"),
		lcServer:   contract.DefaultLCServer,
	}
}

func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func TestRenderEdgeDeployment(t *testing.T) {
	in := testInputs(t, "joint-inference.yaml")
	d, err := renderEdgeDeployment(in)
	if err != nil {
		t.Fatal(err)
	}
	name := "helmet-detection-inference-example-deployment-edge"
	if d.Name != name {
		t.Errorf("name = %s, want Sedna's %s", d.Name, name)
	}
	wantSelector := map[string]string{
		"jointinferenceservice.sedna.io/name":        "helmet-detection-inference-example",
		"jointinferenceservice.sedna.io/uid":         "ji-uid-1",
		"jointinferenceservice.sedna.io/worker-type": "edge",
		"app.sedna.io": "helmet-detection-inference-example-Edge-svc",
	}
	if diff := cmp.Diff(wantSelector, d.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("selector differs from Sedna's (-want +got):\n%s", diff)
	}
	if got := d.Spec.Template.Labels[contract.RoleLabel]; got != "edge" {
		t.Errorf("role label = %q", got)
	}
	if ref := metav1.GetControllerOf(d); ref == nil || ref.UID != "ji-uid-1" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
		t.Errorf("controller reference = %+v, want the service blocking deletion", ref)
	}
	env := envOf(d.Spec.Template.Spec.Containers[0])
	wantEnv := map[string]string{
		"input_shape":              "416,736",
		"video_url":                "rtsp://camera-gate-1.local/stream1",
		contract.EnvNamespace:      "default",
		contract.EnvServiceName:    "helmet-detection-inference-example",
		contract.EnvWorkerName:     name,
		contract.EnvBigModelIP:     "helmet-detection-inference-example-cloud.default",
		contract.EnvBigModelPort:   "5000",
		contract.EnvHEMName:        "IBT",
		contract.EnvHEMParameters:  `[{"key":"threshold_img","value":"0.8"},{"key":"threshold_box","value":"0.6"}]`,
		contract.EnvLCServer:       contract.DefaultLCServer,
		contract.EnvModelURL:       "/home/data/models/little.pb",
		contract.EnvDataPathPrefix: "/home/data",
	}
	for k, v := range wantEnv {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	spec := d.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork=%v dnsPolicy=%q, want the example's host network with cluster DNS", spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.NodeName != "edge-node" {
		t.Errorf("nodeName = %q, want the template's", spec.NodeName)
	}
	for _, taint := range []string{contract.TaintUnreachable, contract.TaintNotReady} {
		found := false
		for _, tol := range spec.Tolerations {
			if tol.Key == taint && tol.Effect == corev1.TaintEffectNoExecute && tol.TolerationSeconds == nil {
				found = true
			}
		}
		if !found {
			t.Errorf("no unbounded NoExecute toleration for %s in %v", taint, spec.Tolerations)
		}
	}
	wantStrategy := appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ptr.To(intstr.FromInt32(0)), MaxUnavailable: ptr.To(intstr.FromInt32(1))}}
	if diff := cmp.Diff(wantStrategy, d.Spec.Strategy); diff != "" {
		t.Errorf("strategy (-want +got):\n%s", diff)
	}
	if d.Spec.Template.Annotations[contract.OfflinePolicyAnnotation] != string(v1alpha1.OfflineActionRestart) {
		t.Errorf("offline policy annotation = %v", d.Spec.Template.Annotations)
	}
	if ptr.Deref(d.Spec.Replicas, 0) != 1 {
		t.Errorf("replicas = %v, want 1 without HPA", d.Spec.Replicas)
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	in := testInputs(t, "joint-inference.yaml")
	a, err := render(in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := render(in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.deployments {
		if diff := cmp.Diff(a.deployments[i], b.deployments[i]); diff != "" {
			t.Errorf("two renders of %s differ (-first +second):\n%s", a.deployments[i].Name, diff)
		}
		if templateHash(a.deployments[i]) != templateHash(b.deployments[i]) {
			t.Errorf("hash of %s is not stable", a.deployments[i].Name)
		}
	}
}

func TestRenderFollowsTheSpec(t *testing.T) {
	userSeconds := int64(30)
	cases := []struct {
		name  string
		edit  func(in *inputs)
		check func(t *testing.T, c desiredChildren)
	}{{
		name: "HPA on both workers hands replicas to the autoscaler",
		edit: func(in *inputs) {
			in.ji.Spec.EdgeWorker.HPA = &v1alpha1.HPA{MinReplicas: ptr.To[int32](1), MaxReplicas: 2}
			in.ji.Spec.CloudWorker.HPA = &v1alpha1.HPA{MaxReplicas: 5}
		},
		check: func(t *testing.T, c desiredChildren) {
			for _, d := range c.deployments {
				if d.Spec.Replicas != nil {
					t.Errorf("%s replicas = %d, want nil under an HPA", d.Name, *d.Spec.Replicas)
				}
				h := c.hpas[HPAName(d.Name)]
				if h == nil || h.Spec.ScaleTargetRef.Name != d.Name {
					t.Errorf("no HPA targeting %s: %+v", d.Name, h)
				}
			}
		},
	}, {
		name: "no HPA: none desired",
		edit: func(in *inputs) {},
		check: func(t *testing.T, c desiredChildren) {
			if len(c.hpas) != 2 {
				t.Fatalf("hpas = %v", c.hpas)
			}
			for name, h := range c.hpas {
				if h != nil {
					t.Errorf("HPA %s rendered without an hpa spec", name)
				}
			}
		},
	}, {
		name: "user strategy and toleration win",
		edit: func(in *inputs) {
			in.ji.Spec.EdgeWorker.Strategy = &appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
			in.ji.Spec.EdgeWorker.Template.Spec.Tolerations = []corev1.Toleration{{Key: contract.TaintUnreachable,
				Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &userSeconds}}
			in.ji.Spec.EdgeWorker.OfflinePolicy = &v1alpha1.OfflinePolicy{Action: v1alpha1.OfflineActionNone}
		},
		check: func(t *testing.T, c desiredChildren) {
			edge := c.deployments[1]
			if edge.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("strategy = %v, want the user's Recreate", edge.Spec.Strategy)
			}
			for _, tol := range edge.Spec.Template.Spec.Tolerations {
				if tol.Key == contract.TaintUnreachable && ptr.Deref(tol.TolerationSeconds, 0) != 30 {
					t.Errorf("user's toleration replaced: %+v", tol)
				}
			}
			if got := edge.Spec.Template.Annotations[contract.OfflinePolicyAnnotation]; got != string(v1alpha1.OfflineActionNone) {
				t.Errorf("offline policy = %q, want None", got)
			}
		},
	}, {
		name: "cloud worker binds the big-model port and stays off the host network",
		edit: func(in *inputs) {},
		check: func(t *testing.T, c desiredChildren) {
			cloud := c.deployments[0]
			if cloud.Name != "helmet-detection-inference-example-deployment-cloud" {
				t.Errorf("cloud name = %s", cloud.Name)
			}
			if env := envOf(cloud.Spec.Template.Spec.Containers[0]); env[contract.EnvBigModelBindPort] != "5000" ||
				env[contract.EnvWorkerName] != cloud.Name || env[contract.EnvModelURL] != "/home/data/models/big.pb" {
				t.Errorf("cloud env = %v", env)
			}
			if cloud.Spec.Template.Spec.HostNetwork || len(cloud.Spec.Template.Spec.Tolerations) != 0 {
				t.Errorf("cloud worker got edge treatment: %+v", cloud.Spec.Template.Spec)
			}
		},
	}, {
		name: "service fronts the cloud worker on tcp-0",
		edit: func(in *inputs) {},
		check: func(t *testing.T, c desiredChildren) {
			s := c.service
			want := []corev1.ServicePort{{Name: "tcp-0", Protocol: corev1.ProtocolTCP, Port: 5000, TargetPort: intstr.FromInt32(5000)}}
			if diff := cmp.Diff(want, s.Spec.Ports); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			if s.Name != "helmet-detection-inference-example-cloud" || s.Spec.Selector["jointinferenceservice.sedna.io/worker-type"] != "cloud" {
				t.Errorf("service %s selects %v", s.Name, s.Spec.Selector)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := testInputs(t, "joint-inference.yaml")
			tc.edit(&in)
			c, err := render(in)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// TestRenderedWorkersHoldNoCredentialValue: a Model on an object store gets its keys into the storage
// initializer by reference to its Secret; a literal key in a Deployment would reach every pod spec, readable by
// every edge agent and stored on its disk.
func TestRenderedWorkersHoldNoCredentialValue(t *testing.T) {
	for _, workerType := range []string{workerEdge, workerCloud} {
		t.Run(workerType, func(t *testing.T) {
			in := testInputs(t, "joint-inference.yaml")
			m := in.cloudModel
			if workerType == workerEdge {
				m = in.edgeModel
			}
			m.Spec.URL, m.Spec.CredentialName = "s3://models/m.pb", "s3-cred"
			in.secrets = map[string]*metav1.PartialObjectMetadata{"s3-cred": {ObjectMeta: metav1.ObjectMeta{Name: "s3-cred",
				Annotations: map[string]string{contract.AnnotationS3Endpoint: "minio.storage:9000"}}}}
			want, err := render(in)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range want.deployments {
				spec := d.Spec.Template.Spec
				refs := 0
				for _, c := range append(spec.InitContainers, spec.Containers...) {
					for _, e := range c.Env {
						if e.Name != contract.EnvAccessKeyID && e.Name != contract.EnvSecretAccessKey {
							continue
						}
						if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
							e.ValueFrom.SecretKeyRef.Name != "s3-cred" || e.ValueFrom.SecretKeyRef.Key != e.Name {
							t.Errorf("%s container %s: %s = %+v, want a reference to key %s of Secret s3-cred", d.Name, c.Name, e.Name, e, e.Name)
						}
						refs++
					}
				}
				if wantRefs := map[bool]int{true: 2, false: 0}[d.Name == DeploymentName(in.ji.Name, workerType)]; refs != wantRefs {
					t.Errorf("%s: %d key references, want %d", d.Name, refs, wantRefs)
				}
			}
		})
	}
}

// The edge worker runs on the host network only when its template says so, as with Sedna; a template on the host
// network without a DNS policy gets cluster DNS, so BIG_MODEL_IP still resolves.
func TestEdgeWorkerHostNetworkIsTheTemplates(t *testing.T) {
	for _, c := range []struct {
		name        string
		hostNetwork bool
		dnsPolicy   corev1.DNSPolicy
		wantDNS     corev1.DNSPolicy
	}{
		{"pod network", false, "", ""},
		{"host network", true, "", corev1.DNSClusterFirstWithHostNet},
		{"host network with the user's DNS policy", true, corev1.DNSDefault, corev1.DNSDefault},
		{"pod network with the user's DNS policy", false, corev1.DNSNone, corev1.DNSNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := testInputs(t, "joint-inference.yaml")
			in.ji.Spec.EdgeWorker.Template.Spec.HostNetwork = c.hostNetwork
			in.ji.Spec.EdgeWorker.Template.Spec.DNSPolicy = c.dnsPolicy
			d, err := renderEdgeDeployment(in)
			if err != nil {
				t.Fatal(err)
			}
			if spec := d.Spec.Template.Spec; spec.HostNetwork != c.hostNetwork || spec.DNSPolicy != c.wantDNS {
				t.Errorf("hostNetwork=%v dnsPolicy=%q, want %v and %q", spec.HostNetwork, spec.DNSPolicy, c.hostNetwork, c.wantDNS)
			}
		})
	}
}
