package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/liveness"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

var kube client.Client

func TestMain(m *testing.M) {
	root, err := testkit.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := harness.ControlPlaneOptions{WithoutScheduler: true, CRDDirs: []string{filepath.Join(root, "deploy", "crds")}, Policies: []string{filepath.Join(root, "deploy", "manifests", "lifeline.yaml")}}
	os.Exit(harness.RunTests(m, opts, func(c *harness.ControlPlane) error {
		kubeconfig = c.Kubeconfig
		kube, err = newClient(c.Kubeconfig, "")
		return err
	}))
}

var kubeconfig string

func TestNodeTableCountsEachNodesWorkersAndSaysItsAgentsState(t *testing.T) {
	now := time.Now()
	cut := nodecondition.Condition(liveness.AgentState{Heard: true, Online: true, APIKnown: true, LastHeartbeat: now}, now.Add(-90*time.Second))
	f := fleet{
		nodes: []corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "edge-b"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cut}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "edge-a"}},
		},
		workloads: []workload{{kind: "JointInferenceService", namespace: "default", name: "ji", workers: []v1alpha1.WorkerStatus{
			{Name: "ji-edge", Node: "edge-b", Liveness: v1alpha1.LivenessDead, Source: v1alpha1.StatusSourceAgent},
			{Name: "ji-cloud", Node: "cloud-1", Liveness: v1alpha1.LivenessAlive, Source: v1alpha1.StatusSourceAPIServer},
		}}, {kind: "FederatedLearningJob", namespace: "default", name: "fl", workers: []v1alpha1.WorkerStatus{
			{Name: "fl-trainworker-0", Node: "edge-b", Liveness: v1alpha1.LivenessAlive, Source: v1alpha1.StatusSourceAgent},
			{Name: "fl-trainworker-1", Node: "edge-a", Liveness: v1alpha1.LivenessUnknown},
		}}},
		heals: map[string]int{"edge-b": 3},
	}
	got := nodeTable(f, now)
	want := [][]string{
		{"NODE", "AGENT", "API SERVER", "SINCE", "ALIVE", "DEAD", "UNKNOWN", "IN THE AGENT'S WORD", "HEALED BY AGENT"},
		{"edge-a", "never-heard", "?", "-", "0", "0", "1", "0", "0"},
		{"edge-b", "heard", "UNREACHABLE", "90s", "1", "1", "0", "2", "3"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nodes:\n%v\nwant\n%v", got, want)
	}
	f.heals = nil // the Events could not be read
	if got := nodeTable(f, now); got[2][8] != "?" {
		t.Errorf("heals unknown shown as %q, want ?", got[2][8])
	}
}

// Against a real API server, as a user runs it: the plugin reads the Nodes' condition and the workloads' status
// with a kubeconfig, and prints them.
func TestPluginPrintsTheFleetFromTheAPIServer(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-plugin", Labels: map[string]string{nodecondition.EdgeNodeLabel: ""}}}
	if err := kube.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return err
		}
		node.Status.Conditions = []corev1.NodeCondition{nodecondition.Condition(
			liveness.AgentState{Heard: true, Online: true, APIKnown: true, LastHeartbeat: time.Now()}, time.Now())}
		return kube.Status().Update(ctx, node)
	})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testkit.Objects("joint-inference.yaml", map[string]string{"EDGE_NODE": "edge-plugin", "CLOUD_NODE": "cloud-1"})
	if err != nil {
		t.Fatal(err)
	}
	var ji *v1alpha1.JointInferenceService
	for _, o := range objs {
		if j, ok := o.(*v1alpha1.JointInferenceService); ok {
			ji = j
		}
	}
	ji.Namespace, ji.Name = "default", "helmet"
	if err := kube.Create(ctx, ji); err != nil {
		t.Fatal(err)
	}
	ji.Status.Workers = []v1alpha1.WorkerStatus{{Name: "helmet-edge", Role: v1alpha1.WorkerRoleEdge, Node: "edge-plugin",
		Liveness: v1alpha1.LivenessDead, Phase: "Failed", Source: v1alpha1.StatusSourceAgent, Restarts: 2}}
	if err := kube.Status().Update(ctx, ji); err != nil {
		t.Fatal(err)
	}

	// What the controller records when the node's agent heals a worker, once offline and twice on command (a
	// series); and an Event of another reason, which is no heal.
	heal := func(name, reason string, series int32) {
		t.Helper()
		e := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, EventTime: metav1.NowMicro(),
			Reason: reason, Type: corev1.EventTypeNormal, Action: "Heal", Note: "Worker helmet-edge: rebuilt",
			ReportingController: "lifeline", ReportingInstance: "lifeline-1",
			Regarding: corev1.ObjectReference{Kind: "JointInferenceService", Namespace: "default", Name: "helmet"},
			Related:   &corev1.ObjectReference{Kind: "Node", Name: "edge-plugin"}}
		if series > 1 {
			e.Series = &eventsv1.EventSeries{Count: series, LastObservedTime: metav1.NowMicro()}
		}
		if err := kube.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	heal("offline", edgeaware.ReasonRestartedOffline, 0)
	heal("commanded", edgeaware.ReasonRestartedByAgent, 2)
	heal("sent", edgeaware.ReasonRestartCommandSent, 0)

	var out bytes.Buffer
	if err := run(ctx, []string{"nodes", "--kubeconfig", kubeconfig}, &out, nil); err != nil {
		t.Fatal(err)
	}
	if !hasLine(out.String(), "edge-plugin", "heard", "UNREACHABLE", "*", "0", "1", "0", "1", "3") {
		t.Errorf("nodes:\n%s", out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"workers", "ji", "helmet", "-n", "default", "--kubeconfig", kubeconfig}, &out, nil); err != nil {
		t.Fatal(err)
	}
	if !hasLine(out.String(), "default", "JointInferenceService/helmet", "helmet-edge", "edge", "edge-plugin", "Dead", "Failed", "agent", "2") {
		t.Errorf("workers:\n%s", out.String())
	}
	if err := run(ctx, []string{"workers", "fl", "helmet", "--kubeconfig", kubeconfig}, &out, nil); err == nil ||
		!strings.Contains(err.Error(), `no FederatedLearningJob "helmet"`) {
		t.Errorf("a workload that does not exist: %v", err)
	}
	if err := run(ctx, []string{"pods"}, &out, kube); err == nil {
		t.Error("an unknown view was accepted")
	}
}

// hasLine tells whether out has a line whose fields begin with fields ("*" matches any one).
func hasLine(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		got := strings.Fields(line)
		if len(got) < len(fields) {
			continue
		}
		match := true
		for i, f := range fields {
			match = match && (f == "*" || got[i] == f)
		}
		if match {
			return true
		}
	}
	return false
}

// Item 7 of the third hardening round: a worker's phase is what a node wrote. An OSC 52 sequence in it would set
// the admin's clipboard, a bidirectional override would reorder what the admin reads; the table prints them as
// text.
func TestNodeWrittenControlSequencesDoNotReachTheTerminal(t *testing.T) {
	osc52 := "Running\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"
	f := fleet{workloads: []workload{{kind: "FederatedLearningJob", namespace: "default", name: "fl", workers: []v1alpha1.WorkerStatus{
		{Name: "fl-trainworker-0", Node: "edge-a", Phase: osc52},
		{Name: "fl-trainworker-1", Node: "edge-a", Phase: "Run\u202eGNINNUR\tx\ny"},
	}}}}
	var out bytes.Buffer
	if err := printTable(&out, workerTable(f, time.Now())); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsFunc(out.String(), func(r rune) bool { return r == '\x1b' || r == '\x07' || r == '\u202e' || r == '\t' }) ||
		strings.Count(out.String(), "\n") != 3 {
		t.Errorf("the table carries control characters:\n%q", out.String())
	}
	if !strings.Contains(out.String(), `Running\x1b]52;c;Y3VybCBldmlsIHwgc2g=\a`) {
		t.Errorf("the phase is not shown as text:\n%s", out.String())
	}
	// JSON escapes ESC and BEL but not the C1 controls (CSI, U+009B) nor bidi overrides; YAML escapes neither.
	f.workloads[0].workers[0].Phase += "\u009b31m"
	for name, write := range map[string]func(io.Writer, [][]string) error{"json": printJSON, "yaml": printYAML} {
		out.Reset()
		if err := write(&out, workerTable(f, time.Now())); err != nil {
			t.Fatal(err)
		}
		if strings.ContainsFunc(out.String(), func(r rune) bool { return r == '\x1b' || r == '\x07' || r == '\u202e' || r == '\u009b' }) {
			t.Errorf("-o %s carries control characters:\n%q", name, out.String())
		}
	}
}

// As kubectl: --context chooses the kubeconfig's context, -A every namespace, -o json a list of items, and --watch
// writes no control sequence where its output is not a terminal. Every value of a table row is one field for awk.
func TestPluginTakesKubectlsFlags(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-flags", Labels: map[string]string{nodecondition.EdgeNodeLabel: ""}}}
	if err := kube.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Delete(ctx, node) })
	ji := &v1alpha1.JointInferenceService{}
	if err := testkit.LoadObject("joint-inference.yaml", map[string]string{"EDGE_NODE": "edge-flags", "CLOUD_NODE": "cloud-1"}, ji); err != nil {
		t.Fatal(err)
	}
	ji.Namespace, ji.Name = "default", "flags"
	if err := kube.Create(ctx, ji); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Delete(ctx, ji) })
	seen := metav1.NewTime(time.Now().Add(-5 * time.Second))
	ji.Status.Workers = []v1alpha1.WorkerStatus{{Name: "flags-edge", Role: v1alpha1.WorkerRoleEdge, Node: "edge-flags",
		Liveness: v1alpha1.LivenessAlive, Phase: "Running", Source: v1alpha1.StatusSourceAgent, LastSeen: &seen}}
	if err := kube.Status().Update(ctx, ji); err != nil {
		t.Fatal(err)
	}

	// A kubeconfig whose current context is a cluster that does not answer, and whose other one is the test's.
	config, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	good := config.CurrentContext
	config.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	config.Contexts["nowhere"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: config.Contexts[good].AuthInfo}
	config.CurrentContext = "nowhere"
	twoContexts := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*config, twoContexts); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"nodes", "--kubeconfig", twoContexts}, &out, nil); err == nil {
		t.Fatal("the current context, a cluster that does not answer, was read")
	}
	if err := run(ctx, []string{"nodes", "--kubeconfig", twoContexts, "--context", good, "-o", "json"}, &out, nil); err != nil {
		t.Fatalf("--context %s: %v", good, err)
	}
	var list struct{ Items []map[string]string }
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out.String())
	}
	found := false
	for _, item := range list.Items {
		found = found || item["node"] == "edge-flags" && item["agent"] == "never-heard" && item["apiServer"] == "?"
	}
	if !found {
		t.Errorf("-o json has no item for edge-flags, never heard:\n%s", out.String())
	}

	for _, view := range []struct {
		args    []string
		columns int
	}{{[]string{"nodes"}, 9}, {[]string{"workers", "-A"}, 10}} {
		out.Reset()
		if err := run(ctx, append(view.args, "--kubeconfig", kubeconfig), &out, nil); err != nil {
			t.Fatalf("%v: %v", view.args, err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) < 2 {
			t.Errorf("%v: no row\n%s", view.args, out.String())
		}
		for _, line := range lines[1:] {
			if n := len(strings.Fields(line)); n != view.columns {
				t.Errorf("%v: %q has %d fields, want one a column (%d)", view.args, line, n, view.columns)
			}
		}
	}
	out.Reset()
	if err := run(ctx, []string{"nodes", "-o", "yaml"}, &out, kube); err != nil || !strings.Contains(out.String(), "node: edge-flags") {
		t.Errorf("-o yaml: %v\n%s", err, out.String())
	}
	if err := run(ctx, []string{"nodes", "-o", "xml"}, &out, kube); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Errorf("-o xml: %v, want an error naming --output", err)
	}

	out.Reset()
	watching, stop := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer stop()
	if err := run(watching, []string{"nodes", "--watch", "--interval", "500ms"}, &out, kube); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "\x1b") || strings.Count(out.String(), "Every 500ms") < 2 {
		t.Errorf("--watch into a buffer:\n%q\nwant frames one after the other, no control sequence", out.String())
	}
}
