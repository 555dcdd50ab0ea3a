package simnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

const roleLabel = "lifeline.sedna.io/role"

func workerPod(name, node string, policy corev1.RestartPolicy) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{roleLabel: "edge"}},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: policy,
			Containers: []corev1.Container{{Name: "main", Image: "sleeper:v1"}}},
	}
}

// apiServerLike is a fake API server holding pods that, as the real one, applies a spec.nodeName field selector
// to a list and a watch (the plain fake ignores field selectors, so a node would take every node's pods for its
// own).
func apiServerLike(t *testing.T, pods ...*corev1.Pod) *fake.Clientset {
	t.Helper()
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p
	}
	client := fake.NewClientset(objs...)
	client.PrependReactor("list", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		selector := action.(k8stesting.ListAction).GetListRestrictions().Fields
		if selector.Empty() {
			return false, nil, nil
		}
		all, err := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "")
		if err != nil {
			return true, nil, err
		}
		list := &corev1.PodList{}
		for _, p := range all.(*corev1.PodList).Items {
			if selector.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) {
				list.Items = append(list.Items, p)
			}
		}
		return true, list, nil
	})
	client.PrependWatchReactor("pods", func(action k8stesting.Action) (bool, watch.Interface, error) {
		selector := action.(k8stesting.WatchAction).GetWatchRestrictions().Fields
		if selector.Empty() {
			return false, nil, nil
		}
		all, err := client.Tracker().Watch(corev1.SchemeGroupVersion.WithResource("pods"), "")
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(all, func(ev watch.Event) (watch.Event, bool) {
			p, ok := ev.Object.(*corev1.Pod)
			return ev, ok && selector.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName})
		}), nil
	})
	return client
}

// startNode runs a hollow node "edge-1" with its MetaServer on a free port and returns the MetaServer's base URL.
func startNode(t *testing.T, client kubernetes.Interface, dir string, backoff time.Duration) (*Node, string) {
	t.Helper()
	n := New(Config{NodeName: "edge-1", Client: client, StateDir: dir, CrashBackoff: backoff,
		Images: map[string][]string{"sleeper": {"sleep", "60"}}, SyncInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = n.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped }) // before the state directory is removed: the node writes into it
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.ServeMetaServer(ctx, l) }()
	return n, "http://" + l.Addr().String()
}

// cutOffClient is a client of an API server the node cannot reach.
func cutOffClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: every request fails at once
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func listNames(t *testing.T, base string, query url.Values) []string {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/pods?" + query.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %v: %s %s", query, resp.Status, body)
	}
	list := &corev1.PodList{}
	if err := json.NewDecoder(resp.Body).Decode(list); err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names
}

func postRestart(t *testing.T, base string, names ...string) string {
	t.Helper()
	body, _ := json.Marshal(names)
	resp, err := http.Post(base+"/api/v1/namespaces/default/pods/restart", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("pods/restart: %s %s", resp.Status, out)
	}
	return strings.TrimSpace(string(out))
}

func apiContainerStatus(t *testing.T, client kubernetes.Interface, name string) corev1.ContainerStatus {
	t.Helper()
	pod, err := client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Status.ContainerStatuses) != 1 {
		return corev1.ContainerStatus{}
	}
	return pod.Status.ContainerStatuses[0]
}

// pods/restart on edgecore only stops the pod's containers (KubeEdge's MetaServer Restart calls StopContainer
// on each): the kill is recorded as one (137), and the container runs again only when the node's crash back-off
// lets it, never sooner. A second call on the exited container changes nothing. The bodies are the real ones.
func TestPodsRestartOnlyStopsTheContainersAndTheCrashBackoffStands(t *testing.T) {
	client := fake.NewClientset(workerPod("w", "edge-1", corev1.RestartPolicyAlways))
	dir := t.TempDir()
	n, base := startNode(t, client, dir, time.Minute)
	testkit.Until(t, waitLimit, "the worker running", func() bool { return ProcessRuns(PIDFile(dir, "default", "w", "main")) })

	if got, want := postRestart(t, base, "w"), `{"LogMessages":["the pod \"default/w\" restart successful"]}`; got != want {
		t.Errorf("pods/restart answered %s, want %s", got, want)
	}
	var stopped corev1.ContainerStatus
	testkit.Until(t, waitLimit, "the API showing the container killed, in back-off", func() bool {
		stopped = apiContainerStatus(t, client, "w")
		last := stopped.LastTerminationState.Terminated
		return stopped.State.Waiting != nil && last != nil && last.ExitCode == 137
	})
	if got, want := postRestart(t, base, "w"), `{"LogMessages":["the pod \"default/w\" restart successful"]}`; got != want {
		t.Errorf("pods/restart of the exited container answered %s, want %s", got, want)
	}
	if got, want := postRestart(t, base, "nosuch"), `{"errMessages":["not found pod:\"/default/nosuch\""]}`; got != want {
		t.Errorf("pods/restart of an unknown pod answered %s, want %s", got, want)
	}
	passAfter(t, n, client) // a node that restarted at once would have done so in it
	if ProcessRuns(PIDFile(dir, "default", "w", "main")) {
		t.Error("the container runs again before its one-minute crash back-off ended")
	}
	now := apiContainerStatus(t, client, "w")
	if now.RestartCount != 0 || now.State.Waiting == nil || now.State.Waiting.Reason != "CrashLoopBackOff" {
		t.Errorf("container status %+v, want waiting in CrashLoopBackOff, not restarted", now)
	}
	if !now.LastTerminationState.Terminated.FinishedAt.Equal(&stopped.LastTerminationState.Terminated.FinishedAt) {
		t.Errorf("a stop of the exited container re-stamped its exit: %v, then %v",
			stopped.LastTerminationState.Terminated.FinishedAt, now.LastTerminationState.Terminated.FinishedAt)
	}
}

// passAfter waits for a whole sync pass of the node's one pod begun after the call. The node writes a status only
// when it changed, so it is made to write it anew, at the end of the pod's pass; twice, so that the second pass
// began after the first had ended. The record of the last write is cleared again while no write came: a write
// under way when it was first cleared records itself once it returns, and the node would then write no more.
func passAfter(t *testing.T, n *Node, client *fake.Clientset) {
	t.Helper()
	rt := n.runtimesWhere(nil)[0]
	forgetReported := func() {
		rt.mu.Lock()
		rt.reported = nil
		rt.mu.Unlock()
	}
	for range 2 {
		before := statusWrites(client)
		forgetReported()
		testkit.Until(t, waitLimit, "the node writing the pod's status anew", func() bool {
			if statusWrites(client) > before {
				return true
			}
			forgetReported()
			return false
		})
	}
}

// statusWrites counts the writes of a pod's status the API server took.
func statusWrites(client *fake.Clientset) int {
	writes := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "pods" && a.GetSubresource() == "status" {
			writes++
		}
	}
	return writes
}

// The back-off of a crashing container doubles from its base at each restart up to its cap, and begins again
// only when the container exits more than 10 minutes after its last start (the kubelet's rule, which edged
// keeps), not after a few seconds of running.
func TestCrashBackoffDoublesUntilTheContainerRanTenMinutes(t *testing.T) {
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		prev int32
		ran  time.Duration
		want time.Duration
	}{
		{"first crash", 0, time.Second, 10 * time.Second},
		{"second crash", 1, time.Second, 20 * time.Second},
		{"third crash, after 30 s of running", 2, 30 * time.Second, 40 * time.Second},
		{"ran 9 minutes", 3, 9 * time.Minute, 80 * time.Second},
		{"capped", 9, time.Second, 5 * time.Minute},
		{"ran over 10 minutes", 6, 11 * time.Minute, 10 * time.Second},
	}
	for _, tc := range cases {
		step := nextBackoffStep(tc.prev, start, start.Add(tc.ran))
		if got := crashBackoff(10*time.Second, 5*time.Minute, step); got != tc.want {
			t.Errorf("%s: back-off %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Cut off from the cloud, edgecore's MetaServer answers from its local store, where a fieldSelector selects
// nothing (measured: `fieldSelector=spec.nodeName=<node>` gives `items: []`); the label selector alone finds the
// node's pods. The node here started cut off, its pods from its own disk.
func TestMetaServerCutOffSelectsNothingByFieldSelector(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{workerPod("worker", "edge-1", corev1.RestartPolicyAlways), workerPod("plain", "edge-1", corev1.RestartPolicyAlways)} {
		if p.Name == "plain" {
			p.Labels = nil
		}
		data, _ := json.Marshal(p)
		if err := os.WriteFile(filepath.Join(dir, "pods", string(p.UID)+".json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, base := startNode(t, cutOffClient(t), dir, time.Minute)
	testkit.Until(t, waitLimit, "the node's pods loaded from its disk", func() bool {
		return strings.Join(listNames(t, base, url.Values{}), ",") == "plain,worker"
	})
	cases := []struct {
		name  string
		query url.Values
		want  string
	}{
		{"field and label selector", url.Values{"fieldSelector": {"spec.nodeName=edge-1"}, "labelSelector": {roleLabel}}, ""},
		{"field selector", url.Values{"fieldSelector": {"spec.nodeName=edge-1"}}, ""},
		{"label selector", url.Values{"labelSelector": {roleLabel}}, "worker"},
		{"label value", url.Values{"labelSelector": {roleLabel + "=edge"}}, "worker"},
		{"nothing", url.Values{}, "plain,worker"},
	}
	for _, tc := range cases {
		if got := strings.Join(listNames(t, base, tc.query), ","); got != tc.want {
			t.Errorf("%s: listed %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := watchAdded(t, base, url.Values{"fieldSelector": {"spec.nodeName=edge-1"}, "labelSelector": {roleLabel}}, 0); got != "" {
		t.Errorf("a cut-off watch with a field selector sent %q, want nothing", got)
	}
}

// Connected, edgecore's MetaServer forwards a list to the cloud, which answers with its own rights: the pods of
// every node, not only this node's. The hollow node does not narrow the answer to itself.
func TestMetaServerConnectedListsEveryNodesPods(t *testing.T) {
	client := apiServerLike(t, workerPod("mine", "edge-1", corev1.RestartPolicyAlways), workerPod("theirs", "edge-2", corev1.RestartPolicyAlways))
	n, base := startNode(t, client, t.TempDir(), time.Minute)
	testkit.Until(t, waitLimit, "the node linked to the cloud", n.cloudLinked.Load)
	if got := strings.Join(listNames(t, base, url.Values{"labelSelector": {roleLabel}}), ","); got != "mine,theirs" {
		t.Errorf("listed %q, want both nodes' pods", got)
	}
}

// edgecore's MetaServer watch ignores the resourceVersion asked for ("base storage now only support rev == 0"):
// every selected pod comes again as ADDED, connected (from the cloud, every node's) or cut off (from the node's
// store).
func TestMetaServerWatchIgnoresResourceVersionAndReplaysEveryPod(t *testing.T) {
	client := apiServerLike(t, workerPod("mine", "edge-1", corev1.RestartPolicyAlways), workerPod("theirs", "edge-2", corev1.RestartPolicyAlways))
	n, base := startNode(t, client, t.TempDir(), time.Minute)
	testkit.Until(t, waitLimit, "the node linked to the cloud", n.cloudLinked.Load)
	query := url.Values{"labelSelector": {roleLabel}, "resourceVersion": {"999999"}}
	if got := watchAdded(t, base, query, 2); got != "mine,theirs" {
		t.Errorf("a connected watch from a late resourceVersion replayed %q, want every pod as ADDED", got)
	}
}

// watchAdded opens a watch and returns the names of the pods it sends as ADDED, sorted, once it has want of
// them or it stays quiet for a second.
func watchAdded(t *testing.T, base string, query url.Values, want int) string {
	t.Helper()
	query.Set("watch", "true")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/pods?"+query.Encode(), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := make(chan string, 64)
	go func() {
		defer close(names)
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
			var ev struct {
				Type   string     `json:"type"`
				Object corev1.Pod `json:"object"`
			}
			if dec.Decode(&ev) != nil {
				return
			}
			if ev.Type == "ADDED" {
				names <- ev.Object.Name
			}
		}
	}()
	var got []string
collect:
	for want == 0 || len(got) < want {
		select {
		case name, ok := <-names:
			if !ok {
				break collect
			}
			got = append(got, name)
		case <-time.After(time.Second):
			break collect
		}
	}
	sort.Strings(got)
	return strings.Join(got, ",")
}

// The fault the rig's fake runtime showed: an exited container stamped with a new finish time (each stop of it).
// The runtime reports the new time, while the node's back-off goes on from the exit: a re-stamp is no new crash.
func TestRestampedExitReportsANewFinishTimeButKeepsTheBackoff(t *testing.T) {
	client := fake.NewClientset(workerPod("w", "edge-1", corev1.RestartPolicyAlways))
	dir := t.TempDir()
	n, _ := startNode(t, client, dir, 2*time.Second)
	testkit.Until(t, waitLimit, "the worker running", func() bool { return ProcessRuns(PIDFile(dir, "default", "w", "main")) })
	if n.RestampExited("default", "w") {
		t.Error("a running container was re-stamped")
	}
	n.StopPod("default", "w")
	killed := time.Now()
	rt := n.runtimesWhere(nil)[0]
	// The node has counted the kill as a crash: only then can a re-stamp be taken for another.
	testkit.Until(t, waitLimit, "the node seeing the kill", func() bool {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.lastExit["main"] != nil
	})
	if !n.RestampExited("default", "w") {
		t.Fatal("no exited container to re-stamp")
	}
	rt.mu.Lock()
	_, _, _, finished := rt.procs["main"].state()
	next := rt.nextStart["main"]
	rt.mu.Unlock()
	if !finished.After(killed) {
		t.Errorf("finish time %v not re-stamped after the kill at %v", finished, killed)
	}
	if next.After(killed.Add(2*time.Second + 50*time.Millisecond)) {
		t.Errorf("the re-stamp moved the restart to %v, %v after the kill: counted as a new crash", next, next.Sub(killed))
	}
	testkit.Until(t, waitLimit, "the worker running again after its back-off", func() bool { return ProcessRuns(PIDFile(dir, "default", "w", "main")) })
}
