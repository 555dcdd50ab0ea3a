package deploy

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/yaml"
)

const componentLabel = "app.kubernetes.io/component"

// schemaNode is one node of values.schema.json, as far as the tests read it.
type schemaNode struct {
	Ref                  string                 `json:"$ref"`
	Type                 any                    `json:"type"`
	Enum                 []any                  `json:"enum"`
	AnyOf                []*schemaNode          `json:"anyOf"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties json.RawMessage        `json:"additionalProperties"`
	Defs                 map[string]*schemaNode `json:"$defs"`
}

// Every value of values.yaml has a type in values.schema.json, every object the chart defines refuses keys it does
// not know, and the schema has no value values.yaml does not list with its default.
func TestValuesSchemaCoversEveryValue(t *testing.T) {
	data, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var root schemaNode
	if err := json.Unmarshal(data, &root); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	data, err = os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	resolve := func(n *schemaNode) *schemaNode {
		if name, ok := strings.CutPrefix(n.Ref, "#/$defs/"); ok {
			if d := root.Defs[name]; d != nil {
				return d
			}
			t.Fatalf("$ref %s names no definition", n.Ref)
		}
		return n
	}
	var walk func(path string, value any, n *schemaNode)
	walk = func(path string, value any, n *schemaNode) {
		n = resolve(n)
		if n.Type == nil && n.Enum == nil && n.AnyOf == nil {
			t.Errorf("%s: the schema gives it no type", path)
		}
		m, isMap := value.(map[string]any)
		if n.Properties != nil && string(n.AdditionalProperties) != "false" {
			t.Errorf("%s: additionalProperties %s, want false: a misspelt key there would be ignored", path, n.AdditionalProperties)
		}
		if !isMap || len(m) == 0 {
			return
		}
		for _, key := range slices.Sorted(maps.Keys(m)) {
			child := n.Properties[key]
			if child == nil && len(n.AdditionalProperties) > 0 && n.AdditionalProperties[0] == '{' {
				child = new(schemaNode)
				if err := json.Unmarshal(n.AdditionalProperties, child); err != nil {
					t.Fatal(err)
				}
			}
			if child == nil {
				t.Errorf("%s.%s: not in values.schema.json, so every install would fail", path, key)
				continue
			}
			walk(path+"."+key, m[key], child)
		}
		for key := range n.Properties {
			if _, ok := m[key]; !ok {
				t.Errorf("%s.%s: in values.schema.json but not in values.yaml, which lists every value with its default", path, key)
			}
		}
	}
	walk("values", values, &root)
}

// A value of the wrong type, outside its enum or range, or misspelt fails the install, and helm's message names it.
func TestChartRefusesMistypedValues(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"controller.replicas=zero", "at '/controller/replicas': got string, want integer"},
		{"controller.replicas=0", "at '/controller/replicas': minimum: got 0, want 1"},
		{"nodeIdentity.mode=bogus", "at '/nodeIdentity/mode': value must be one of 'kubeedgeCert', 'password'"},
		{"broker.service.type=ExternalName", "at '/broker/service/type': value must be one of 'NodePort', 'LoadBalancer', 'ClusterIP'"},
		{"broker.port=70000", "at '/broker/port': maximum: got 70,000, want 65,535"},
		{"agent.bogus=1", "at '/agent': additional properties 'bogus' not allowed"},
		{"controler.replicas=2", "at '': additional properties 'controler' not allowed"},
		{"broker.tls.existingSecrets=mine", "at '/broker/tls': additional properties 'existingSecrets' not allowed"},
		{"controller.namespaces={Team_A}", "at '/controller/namespaces/0': 'Team_A' does not match pattern"},
		{"cluster=edge/eu", "at '/cluster': 'edge/eu' does not match pattern"},
		{"agent.edgecore.requireAuthorization=yes", "at '/agent/edgecore/requireAuthorization': got string, want boolean"},
		{"agent.edgecore.metaServer=127.0.0.1:10550", "at '/agent/edgecore/metaServer': '127.0.0.1:10550' does not match pattern"},
		{"agent.image.pullPolicy=Sometimes", "at '/agent/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"},
		{"controller.resources.limits.memory=lots", "at '/controller/resources/limits/memory'"},
		{"imagePullSecrets={my-registry}", "at '/imagePullSecrets/0': got string, want object"},
		{"controller.priorityClassName=High", "at '/controller/priorityClassName': 'High' does not match pattern"},
		{"agent.nodeSelector.disk=1", "at '/agent/nodeSelector/disk': got number, want string"},
		{"agent.maxSurge=0", "at '/agent/maxSurge'"},
		{"agent.maxSurge=all", "at '/agent/maxSurge'"},
	} {
		flags := []string{"--set", "nodeIdentity.mode=password", "--set", tc.set}
		for _, cmd := range [][]string{{"template", "lifeline", chartDir, "--namespace", namespace}, {"lint", chartDir}} {
			out, err := runHelm(t, append(cmd, flags...)...)
			// helm lint prints what it found on its standard output.
			if msg := string(out) + "\n" + errString(err); err == nil || !strings.Contains(msg, tc.want) {
				t.Errorf("helm %s --set %s: %v, want an error saying %q\n%s", cmd[0], tc.set, err, tc.want, out)
			}
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// node is a node as the scheduler matches it: its name and labels.
type node struct {
	name   string
	labels map[string]string
}

var nodeSelectorOperators = map[corev1.NodeSelectorOperator]selection.Operator{
	corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
	corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
}

// admits says whether the scheduler may put pod on n, by its nodeSelector and its required node affinity.
func admits(t *testing.T, pod corev1.PodSpec, n node) bool {
	t.Helper()
	if !labels.SelectorFromSet(pod.NodeSelector).Matches(labels.Set(n.labels)) {
		return false
	}
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil || pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	matches := func(reqs []corev1.NodeSelectorRequirement, set labels.Set) bool {
		sel := labels.NewSelector()
		for _, r := range reqs {
			req, err := labels.NewRequirement(r.Key, nodeSelectorOperators[r.Operator], r.Values)
			if err != nil {
				t.Fatalf("node selector requirement %+v: %v", r, err)
			}
			sel = sel.Add(*req)
		}
		return sel.Matches(set)
	}
	// The terms are alternatives; an empty term matches no node.
	for _, term := range pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if (len(term.MatchExpressions) > 0 || len(term.MatchFields) > 0) && matches(term.MatchExpressions, n.labels) &&
			matches(term.MatchFields, labels.Set{"metadata.name": n.name}) {
			return true
		}
	}
	return false
}

const edgeRole = "node-role.kubernetes.io/edge"

// The controller and the uninstall Job run where controller.nodeSelector, .tolerations and .affinity say, with the
// controller's PriorityClass, and never on an edge node: the chart's rule is in each of the user's required terms.
func TestControllerSchedulingValues(t *testing.T) {
	values := writeFile(t, `
controller:
  priorityClassName: lifeline-critical
  nodeSelector: {pool: cloud}
  tolerations:
    - {key: dedicated, operator: Equal, value: lifeline, effect: NoSchedule}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [zone-a]}]
          - matchFields: [{key: metadata.name, operator: In, values: [spare]}]
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app.kubernetes.io/name: lifeline-controller}}
`)
	objs := renderChart(t, "--set", "nodeIdentity.mode=password", "-f", values)
	for name, pod := range map[string]corev1.PodSpec{
		"the controller":    mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec,
		"the uninstall Job": mustObject[batchv1.Job](t, objs, "Job", "lifeline-release").Spec.Template.Spec,
	} {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				node node
				want bool
			}{
				{node{"cloud-1", map[string]string{"pool": "cloud", "topology.kubernetes.io/zone": "zone-a"}}, true},
				{node{"spare", map[string]string{"pool": "cloud"}}, true},
				{node{"cloud-2", map[string]string{"pool": "cloud", "topology.kubernetes.io/zone": "zone-b"}}, false},
				{node{"gpu-1", map[string]string{"pool": "gpu", "topology.kubernetes.io/zone": "zone-a"}}, false},
				{node{"edge-1", map[string]string{"pool": "cloud", "topology.kubernetes.io/zone": "zone-a", edgeRole: ""}}, false},
				{node{"spare", map[string]string{"pool": "cloud", edgeRole: ""}}, false},
			} {
				if got := admits(t, pod, tc.node); got != tc.want {
					t.Errorf("may run on %s %v: %v, want %v (nodeSelector %v, affinity %+v)", tc.node.name, tc.node.labels, got, tc.want,
						pod.NodeSelector, pod.Affinity.NodeAffinity)
				}
			}
			want := corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "lifeline", Effect: corev1.TaintEffectNoSchedule}
			if len(pod.Tolerations) != 1 || pod.Tolerations[0] != want {
				t.Errorf("tolerations %+v, want %+v", pod.Tolerations, want)
			}
			if a := pod.Affinity.PodAntiAffinity; a == nil || len(a.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
				a.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
				t.Errorf("podAntiAffinity %+v, want controller.affinity's", a)
			}
		})
	}
	if got := mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec.PriorityClassName; got != "lifeline-critical" {
		t.Errorf("the controller's priorityClassName %q, want lifeline-critical", got)
	}

	// By default: any node of the cloud, none of the edge, and the cluster's default priority.
	objs = renderChart(t, "--set", "nodeIdentity.mode=password")
	for name, pod := range map[string]corev1.PodSpec{
		"the controller":    mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec,
		"the uninstall Job": mustObject[batchv1.Job](t, objs, "Job", "lifeline-release").Spec.Template.Spec,
	} {
		if !admits(t, pod, node{"cloud-1", map[string]string{"kubernetes.io/os": "linux"}}) || admits(t, pod, node{"edge-1", map[string]string{edgeRole: ""}}) {
			t.Errorf("%s: nodeSelector %v, affinity %+v: want any node but the edge's", name, pod.NodeSelector, pod.Affinity)
		}
		if pod.PriorityClassName != "" || len(pod.Tolerations) != 0 {
			t.Errorf("%s: priorityClassName %q, tolerations %v: want neither by default", name, pod.PriorityClassName, pod.Tolerations)
		}
	}
}

// agent.nodeSelector narrows the edge nodes the agent runs on, and cannot take it off them; agent.priorityClassName
// is its pods'.
func TestAgentSchedulingValues(t *testing.T) {
	values := writeFile(t, `
agent:
  priorityClassName: system-node-critical
  nodeSelector:
    kubernetes.io/arch: arm64
    node-role.kubernetes.io/edge: "false"
`)
	pod := mustObject[appsv1.DaemonSet](t, renderChart(t, "--set", "nodeIdentity.mode=password", "-f", values), "DaemonSet", "lifeline-agent").Spec.Template.Spec
	for _, tc := range []struct {
		node node
		want bool
	}{
		{node{"edge-arm", map[string]string{edgeRole: "", "kubernetes.io/arch": "arm64"}}, true},
		{node{"edge-amd", map[string]string{edgeRole: "", "kubernetes.io/arch": "amd64"}}, false},
		{node{"cloud-arm", map[string]string{"kubernetes.io/arch": "arm64"}}, false},
		{node{"cloud-arm-false", map[string]string{edgeRole: "false", "kubernetes.io/arch": "arm64"}}, false},
	} {
		if got := admits(t, pod, tc.node); got != tc.want {
			t.Errorf("the agent may run on %s %v: %v, want %v (nodeSelector %v)", tc.node.name, tc.node.labels, got, tc.want, pod.NodeSelector)
		}
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("the agent's priorityClassName %q, want system-node-critical", pod.PriorityClassName)
	}
	if !tolerates(pod.Tolerations, edgeRole, corev1.TaintEffectNoSchedule) {
		t.Errorf("tolerations %+v: the edge role's taint is no longer tolerated", pod.Tolerations)
	}
}

// An update starts each node's new agent beside the old one, which hands the node over: never one stopped first.
func TestAgentUpdateSurges(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want intstr.IntOrString
	}{
		{nil, intstr.FromInt32(1)},
		{[]string{"--set", "agent.maxSurge=10%"}, intstr.FromString("10%")},
		{[]string{"--set", "agent.maxSurge=3"}, intstr.FromInt32(3)},
	} {
		ds := mustObject[appsv1.DaemonSet](t, renderChart(t, append([]string{"--set", "nodeIdentity.mode=password"}, tc.set...)...), "DaemonSet", "lifeline-agent")
		u := ds.Spec.UpdateStrategy
		if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxSurge == nil ||
			*u.RollingUpdate.MaxSurge != tc.want || u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 0 {
			t.Errorf("%v: update strategy %+v, want a rolling update with maxSurge %s and maxUnavailable 0", tc.set, u.RollingUpdate, tc.want.String())
		}
	}
}

// imagePullSecrets reach every pod of the chart: the controller's, the agents' and the uninstall Job's, which runs
// the controller's image.
func TestImagePullSecretsReachEveryPod(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  []corev1.LocalObjectReference
	}{
		{nil, nil},
		{[]string{"--set", "imagePullSecrets[0].name=registry-a", "--set", "imagePullSecrets[1].name=registry-b"},
			[]corev1.LocalObjectReference{{Name: "registry-a"}, {Name: "registry-b"}}},
	} {
		objs := renderChart(t, append([]string{"--set", "nodeIdentity.mode=password"}, tc.flags...)...)
		for name, pod := range map[string]corev1.PodSpec{
			"the controller":    mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec,
			"the agent":         mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent").Spec.Template.Spec,
			"the uninstall Job": mustObject[batchv1.Job](t, objs, "Job", "lifeline-release").Spec.Template.Spec,
		} {
			if !slices.Equal(pod.ImagePullSecrets, tc.want) {
				t.Errorf("%v: %s pulls with %v, want %v", tc.flags, name, pod.ImagePullSecrets, tc.want)
			}
		}
	}
}

// With more than one replica, a drain never evicts the last controller (and the broker with it); with one, no
// budget would let a drain through, so there is none.
func TestControllerDisruptionBudget(t *testing.T) {
	objs := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "controller.replicas=3")
	pdb := mustObject[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", "lifeline-controller")
	d := mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("budget minAvailable %v maxUnavailable %v, want minAvailable 1", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	if pdb.Namespace != namespace || pdb.Spec.Selector == nil || !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) ||
		!maps.Equal(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("budget in %s selects %v, want the controller's pods (%v) in %s", pdb.Namespace, pdb.Spec.Selector, d.Spec.Selector.MatchLabels, namespace)
	}
	for name, objs := range map[string][]*unstructured.Unstructured{
		"one replica":         renderChart(t, "--set", "nodeIdentity.mode=password"),
		"the plain manifests": readManifests(t),
	} {
		for _, o := range objs {
			if o.GetKind() == "PodDisruptionBudget" {
				t.Errorf("%s: PodDisruptionBudget %s, which would block every drain of the controller's node", name, o.GetName())
			}
		}
	}
}

// Every object says which part of Lifeline it is (app.kubernetes.io/component), and so do the pods, while the
// selectors stay what they were: a Deployment's or DaemonSet's selector cannot change on upgrade, and the
// Service and NetworkPolicy keep selecting the controller's pods of releases installed before.
func TestComponentLabels(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	objs := renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile, "--set", "controller.replicas=2",
		"--set", "controller.namespaces={team-a}", "--set", "agent.edgecore.requireAuthorization=true", "--set", "broker.tls.generatedBy=helm")
	component := func(name string) string {
		switch {
		case name == "lifeline-agent", strings.HasPrefix(name, "lifeline-agent-"):
			return "agent"
		case name == "lifeline-metrics-reader":
			return "controller"
		case strings.HasPrefix(name, "lifeline-broker"), name == "lifeline-kubeedge-ca":
			return "broker"
		case name == "lifeline-release":
			return "release"
		case name == "lifeline-fl-immutable-workers":
			return "api"
		case strings.HasPrefix(name, "lifeline-controller"):
			return "controller"
		}
		return "?"
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		if got, want := o.GetLabels()[componentLabel], component(o.GetName()); got != want {
			t.Errorf("%s %s: component %q, want %q", o.GetKind(), o.GetName(), got, want)
		}
	}
	for _, kind := range []string{"Deployment", "DaemonSet", "Service", "Job", "PodDisruptionBudget", "ClusterRole", "Secret", "ConfigMap"} {
		if !kinds[kind] {
			t.Errorf("no %s rendered: the rendering does not cover every kind of object", kind)
		}
	}

	d := mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller")
	ds := mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent")
	svc := mustObject[corev1.Service](t, objs, "Service", "lifeline-broker")
	for _, tc := range []struct {
		what      string
		selector  map[string]string
		want      map[string]string
		pods      map[string]string
		component string
	}{
		{"the controller's Deployment", d.Spec.Selector.MatchLabels, map[string]string{"app.kubernetes.io/name": "lifeline-controller"}, d.Spec.Template.Labels, "controller"},
		{"the agent's DaemonSet", ds.Spec.Selector.MatchLabels, map[string]string{"app.kubernetes.io/name": "lifeline-agent"}, ds.Spec.Template.Labels, "agent"},
		{"the broker's Service", svc.Spec.Selector, map[string]string{"app.kubernetes.io/name": "lifeline-controller"}, d.Spec.Template.Labels, "controller"},
	} {
		if !maps.Equal(tc.selector, tc.want) {
			t.Errorf("%s selects %v, want %v as before", tc.what, tc.selector, tc.want)
		}
		if !labels.SelectorFromSet(tc.selector).Matches(labels.Set(tc.pods)) || tc.pods[componentLabel] != tc.component {
			t.Errorf("%s: pods labelled %v, want them selected and labelled %s=%s", tc.what, tc.pods, componentLabel, tc.component)
		}
	}
	if got := svc.Labels[componentLabel]; got != "broker" {
		t.Errorf("the Service's component %q, want broker", got)
	}
	job := mustObject[batchv1.Job](t, objs, "Job", "lifeline-release")
	if labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(job.Spec.Template.Labels)) {
		t.Errorf("the uninstall Job's pod %v would count as a controller's", job.Spec.Template.Labels)
	}
}
