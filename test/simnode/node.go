package simnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// Labels KubeEdge puts on an edge node (keadm join); the role label is not published as a constant by KubeEdge.
var EdgeNodeLabels = map[string]string{"node-role.kubernetes.io/edge": "", "node-role.kubernetes.io/agent": ""}

// Config configures a hollow node.
type Config struct {
	NodeName string
	Client   kubernetes.Interface
	// StateDir keeps the node's pods, container logs and pid files.
	StateDir string
	// Images maps an image (without its tag) to the command that stands in for it.
	Images map[string][]string
	// Labels of the Node; nil means EdgeNodeLabels.
	Labels map[string]string
	// HeartbeatInterval and LeaseDuration are edged's 10 s and 40 s by default.
	HeartbeatInterval, LeaseDuration time.Duration
	// CrashBackoff and MaxCrashBackoff bound the restart delay of a crashing container (kubelet: 10 s, 5 min).
	CrashBackoff, MaxCrashBackoff time.Duration
	// SyncInterval is how often containers are checked (default 200 ms).
	SyncInterval time.Duration
	// StaticPodDir, when set, is edged's manifest directory: the pods in it run without the API server.
	StaticPodDir string
	// LCServer, when set, replaces the workers' LC_SERVER: every simulated node shares this machine's
	// localhost, so each node's agent listens on its own port instead of the contract's 9100.
	LCServer string
}

// Node runs pods as processes.
type Node struct {
	cfg Config

	mu   sync.Mutex
	pods map[types.UID]*podRuntime
	// endedStatic holds when each static pod the node ended stopped, by UID (uidPurgeAfter).
	endedStatic map[types.UID]time.Time

	hostsMu      sync.Mutex
	serviceHosts map[string]bool // env value -> names a Service

	eventsMu  sync.Mutex
	eventSubs map[chan runtimeapi.ContainerEventType]bool // CRI container event streams

	// cloudLinked says whether the node's own list and watch of the API server work now, as edgehub's
	// connection to cloudcore does: the MetaServer answers from the cloud while it does, from the node's store
	// otherwise.
	cloudLinked atomic.Bool
	// hub imitates edgehub's late notice of a cut, when asked to.
	hub edgehub

	// foreign holds, by UID, the other nodes' pods the cloud sent through the MetaServer: edgecore keeps what a
	// forwarded list or watch delivers in the node's store, whatever node the pod is bound to, and answers
	// from it once cut off (seen on KubeEdge: a label-only list, cut off, returned another node's pod).
	foreignMu sync.Mutex
	foreign   map[types.UID]*corev1.Pod
}

// podRuntime is a pod the node runs, with its processes by container name. mu guards every field; the node's
// lock, when both are taken, is taken first.
type podRuntime struct {
	mu        sync.Mutex
	pod       *corev1.Pod
	procs     map[string]*process
	restarts  map[string]int32
	nextStart map[string]time.Time
	lastExit  map[string]*corev1.ContainerStateTerminated
	// backoffSteps counts the restarts of a container since its crash back-off last began again from its
	// base. Like the kubelet's back-off it lives in memory only: a restarted node begins from the base.
	backoffSteps map[string]int32
	reported     *corev1.PodStatus
	stopping     bool
	started      time.Time
	// notBefore holds a static pod's first containers back while its mirror-pod request waits (edgehub).
	notBefore time.Time
	// initDone holds the init containers that exited 0.
	initDone map[string]bool
}

// New returns a node; Run starts it.
func New(cfg Config) *Node {
	if cfg.Labels == nil {
		cfg.Labels = EdgeNodeLabels
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 40 * time.Second
	}
	if cfg.CrashBackoff == 0 {
		cfg.CrashBackoff = 10 * time.Second
	}
	if cfg.MaxCrashBackoff == 0 {
		cfg.MaxCrashBackoff = 5 * time.Minute
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = 200 * time.Millisecond
	}
	return &Node{cfg: cfg, pods: map[types.UID]*podRuntime{}, endedStatic: map[types.UID]time.Time{}, serviceHosts: map[string]bool{}, eventSubs: map[chan runtimeapi.ContainerEventType]bool{}}
}

// Run serves the node until ctx ends: pods kept on disk run at once, before the API server is reached.
func (n *Node) Run(ctx context.Context) error {
	for _, dir := range []string{"pods", "logs", "pids"} {
		if err := os.MkdirAll(filepath.Join(n.cfg.StateDir, dir), 0o755); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
	}
	n.loadPods()
	// Run returns only once nothing of the node writes into its state directory any more.
	var running sync.WaitGroup
	running.Go(func() { n.register(ctx) })
	running.Go(func() { n.watchPods(ctx) })
	tick := time.NewTicker(n.cfg.SyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			running.Wait()
			n.stopAll()
			return nil
		case <-tick.C:
			n.syncStaticPods()
			n.syncAll(ctx)
		}
	}
}

// register creates the Node and keeps it Ready, retrying while the API server is out of reach.
func (n *Node) register(ctx context.Context) {
	_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		return Register(ctx, n.cfg.Client, n.cfg.NodeName, n.cfg.Labels, n.cfg.LeaseDuration) == nil, nil
	})
	// The Node's heartbeat goes through edgehub: none while it is disconnected.
	KeepAliveWhile(ctx, n.cfg.Client, n.cfg.NodeName, n.cfg.HeartbeatInterval, n.cfg.LeaseDuration, n.cloudLinked.Load)
}

// watchPods lists and watches the pods bound to the node; a pod the API no longer has is stopped.
func (n *Node) watchPods(ctx context.Context) {
	selector := fields.OneTermEqualSelector("spec.nodeName", n.cfg.NodeName).String()
	pods := n.cfg.Client.CoreV1().Pods("")
	for ctx.Err() == nil {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: selector})
		if !n.setCloudLinked(err == nil) {
			select { // cut off, or edgehub not yet reconnected: the cloud's word is not heard
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		seen := map[types.UID]bool{}
		for i := range list.Items {
			seen[list.Items[i].UID] = true
			n.upsert(&list.Items[i])
		}
		n.forgetMissing(seen)
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
		if err != nil {
			n.setCloudLinked(false)
			continue
		}
		n.followWatch(ctx, w)
		w.Stop()
		// The watch ended: the link broke, or the server ended it (the list that follows then succeeds and says
		// so). For edgehub's imitation the link broke now, though the node's next list may take seconds to fail.
		n.hub.linked(false, time.Now())
	}
}

// followWatch applies the watch's events until it ends or ctx is done.
func (n *Node) followWatch(ctx context.Context, w watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, open := <-w.ResultChan():
			if !open {
				return
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				n.upsert(pod)
			case watch.Deleted:
				n.forget(pod.UID)
			}
		}
	}
}

// setCloudLinked records whether the node's link to the cloud works, and tells whether edgehub is connected.
func (n *Node) setCloudLinked(ok bool) bool {
	now := time.Now()
	n.hub.linked(ok, now)
	connected := n.hub.connected(ok, now)
	n.cloudLinked.Store(connected)
	return connected
}

func (n *Node) upsert(pod *corev1.Pod) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rt, ok := n.pods[pod.UID]
	if !ok {
		rt = &podRuntime{procs: map[string]*process{}, restarts: map[string]int32{}, nextStart: map[string]time.Time{}, initDone: map[string]bool{},
			lastExit: map[string]*corev1.ContainerStateTerminated{}, backoffSteps: map[string]int32{}, started: time.Now()}
		n.pods[pod.UID] = rt
	}
	rt.mu.Lock()
	rt.pod = pod.DeepCopy()
	rt.mu.Unlock()
	n.savePod(pod)
}

// forget stops a pod the API server deleted (it is gone: nothing to report).
func (n *Node) forget(uid types.UID) {
	n.mu.Lock()
	rt := n.pods[uid]
	delete(n.pods, uid)
	n.mu.Unlock()
	if rt != nil {
		go stopProcesses(rt, 0)
		_ = os.Remove(n.podFile(uid))
	}
}

// forgetMissing stops the API-given pods the API server's list no longer has (static pods are not its).
func (n *Node) forgetMissing(seen map[types.UID]bool) {
	for _, rt := range n.runtimesWhere(func(pod *corev1.Pod) bool { return !seen[pod.UID] && !isStatic(pod) }) {
		n.forget(rt.pod.UID)
	}
}

// runtimesWhere returns the pods the node runs whose pod object keep accepts (all of them for nil), each
// looked at under its lock.
func (n *Node) runtimesWhere(keep func(*corev1.Pod) bool) []*podRuntime {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*podRuntime, 0, len(n.pods))
	for _, rt := range n.pods {
		rt.mu.Lock()
		kept := keep == nil || keep(rt.pod)
		rt.mu.Unlock()
		if kept {
			out = append(out, rt)
		}
	}
	return out
}

// syncAll runs one pass over every pod: start or restart containers, finish deletions, report status.
func (n *Node) syncAll(ctx context.Context) {
	for _, rt := range n.runtimesWhere(nil) {
		n.syncPod(ctx, rt)
	}
}

func (n *Node) syncPod(ctx context.Context, rt *podRuntime) {
	rt.mu.Lock()
	pod := rt.pod
	if pod.DeletionTimestamp != nil {
		if !rt.stopping {
			rt.stopping = true
			grace := time.Duration(ptr.Deref(pod.DeletionGracePeriodSeconds, 30)) * time.Second
			go n.finishDeletion(ctx, rt, grace)
		}
		rt.mu.Unlock()
		return
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		rt.mu.Unlock()
		return // terminal: containers are not run again
	}
	policy := pod.Spec.RestartPolicy
	now := time.Now()
	if !n.initialized(ctx, rt, now) || n.tokenWithheld(rt) {
		status := n.podStatus(rt)
		rt.mu.Unlock()
		n.reportStatus(ctx, rt, pod, status)
		return
	}
	for _, c := range pod.Spec.Containers {
		p := rt.procs[c.Name]
		if p == nil && now.Before(rt.notBefore) {
			continue
		}
		if p != nil {
			running, code, startedAt, finished := p.state()
			if running {
				continue
			}
			if rt.lastExit[c.Name] == nil || !rt.lastExit[c.Name].FinishedAt.Time.Equal(finished) {
				rt.lastExit[c.Name] = &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: exitReason(code),
					StartedAt: metav1.NewTime(startedAt), FinishedAt: metav1.NewTime(finished)}
				if !shouldRestart(policy, code) {
					continue
				}
				step := nextBackoffStep(rt.backoffSteps[c.Name], startedAt, finished)
				rt.backoffSteps[c.Name] = step
				rt.nextStart[c.Name] = finished.Add(crashBackoff(n.cfg.CrashBackoff, n.cfg.MaxCrashBackoff, step))
			}
			if !shouldRestart(policy, code) || now.Before(rt.nextStart[c.Name]) {
				continue
			}
			rt.restarts[c.Name]++
		}
		if err := n.startContainer(ctx, rt, c); err != nil {
			rt.lastExit[c.Name] = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(),
				FinishedAt: metav1.Now()}
			rt.nextStart[c.Name] = now.Add(n.cfg.CrashBackoff)
		}
	}
	status := n.podStatus(rt)
	rt.mu.Unlock()
	n.reportStatus(ctx, rt, pod, status)
}

// initialized runs the pod's init containers whose image is mapped, one after the other, each until it exits 0
// (a failed one is run again after the crash back-off), and tells whether they all have; an init container whose
// image is not mapped is skipped (Sedna's storage initializer: the simulation's models are node paths). rt.mu held.
func (n *Node) initialized(ctx context.Context, rt *podRuntime, now time.Time) bool {
	for _, c := range rt.pod.Spec.InitContainers {
		if _, mapped := n.cfg.Images[imageName(c.Image)]; !mapped || rt.initDone[c.Name] {
			continue
		}
		p := rt.procs[c.Name]
		if p != nil {
			running, code, _, finished := p.state()
			switch {
			case running:
				return false
			case code == 0:
				rt.initDone[c.Name] = true
				continue
			case now.Before(finished.Add(n.cfg.CrashBackoff)):
				return false
			}
			rt.restarts[c.Name]++
		} else if now.Before(rt.notBefore) {
			return false
		}
		if err := n.startContainer(ctx, rt, c); err != nil {
			rt.lastExit[c.Name] = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(),
				FinishedAt: metav1.Now()}
		}
		return false
	}
	return true
}

func exitReason(code int) string {
	if code == 0 {
		return "Completed"
	}
	return "Error"
}

// startContainer runs one container of a pod.
func (n *Node) startContainer(ctx context.Context, rt *podRuntime, c corev1.Container) error {
	pod := rt.pod
	argv, ok := n.cfg.Images[imageName(c.Image)]
	if !ok {
		return fmt.Errorf("image %s is not mapped to an executable", c.Image)
	}
	// As a runtime does: a container's command replaces its image's (the command an image is mapped to).
	if len(c.Command) > 0 {
		argv = c.Command
	}
	argv = append(append([]string(nil), argv...), c.Args...)
	p, err := startProcess(argv, n.containerEnv(ctx, pod, c), n.cfg.StateDir,
		LogFile(n.cfg.StateDir, pod.Namespace, pod.Name, c.Name), PIDFile(n.cfg.StateDir, pod.Namespace, pod.Name, c.Name),
		func() { n.containerChanged(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT) })
	if err != nil {
		return err
	}
	rt.procs[c.Name] = p
	n.containerChanged(runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	return nil
}

// imageName drops the tag or digest of an image reference.
func imageName(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// containerEnv is the container's environment as a node would give it: its variables, the downward API fields
// the worker contract uses, and a cluster Service host (`<service>.<namespace>`) resolved to this machine, where
// every simulated node's host network is.
func (n *Node) containerEnv(ctx context.Context, pod *corev1.Pod, c corev1.Container) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + n.cfg.StateDir, "LIFELINE_SIM_NODE=" + n.cfg.NodeName}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "metadata.uid":
				v = string(pod.UID)
			case "spec.nodeName":
				v = n.cfg.NodeName
			case "status.podIP", "status.hostIP":
				v = "127.0.0.1"
			}
		}
		if n.isServiceHost(ctx, v) {
			v = "127.0.0.1"
		}
		if e.Name == contract.EnvLCServer && n.cfg.LCServer != "" {
			v = n.cfg.LCServer
		}
		env = append(env, e.Name+"="+v)
	}
	return env
}

// isServiceHost answers from what the node learnt before, as edged resolves from its local store: a node cut off
// from the API server must still start containers (and must not hold a pod's lock on a hanging request).
func (n *Node) isServiceHost(ctx context.Context, v string) bool {
	name, ns, ok := strings.Cut(v, ".")
	if !ok || name == "" || strings.Contains(ns, ".") || strings.ContainsAny(v, "/:") {
		return false
	}
	n.hostsMu.Lock()
	known, cached := n.serviceHosts[v]
	n.hostsMu.Unlock()
	if cached {
		return known
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := n.cfg.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return false // unknown for now: asked again at the next start
	}
	n.hostsMu.Lock()
	n.serviceHosts[v] = err == nil
	n.hostsMu.Unlock()
	return err == nil
}

// reportStatus writes the pod's status through the API when it changed.
func (n *Node) reportStatus(ctx context.Context, rt *podRuntime, pod *corev1.Pod, status corev1.PodStatus) {
	rt.mu.Lock()
	unchanged := rt.reported != nil && equality.Semantic.DeepEqual(*rt.reported, status)
	rt.mu.Unlock()
	if unchanged {
		return
	}
	update := pod.DeepCopy()
	update.Status = status
	n.savePod(update) // the node's own record, current even while the API server is out of reach
	if isStatic(pod) {
		rt.mu.Lock()
		rt.reported, rt.pod = &status, update // no API object: the node's record is all there is
		rt.mu.Unlock()
		return
	}
	if !n.cloudLinked.Load() {
		return // edgehub is disconnected: posted once it reconnects (the status still differs then)
	}
	got, err := n.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, update, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			if fresh, gerr := n.cfg.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); gerr == nil && fresh.UID == pod.UID {
				n.upsert(fresh)
			}
		}
		return // retried on the next pass; while cut off the node keeps running its pods
	}
	rt.mu.Lock()
	rt.reported = &status
	rt.mu.Unlock()
	n.upsert(got)
}

func (n *Node) podStatus(rt *podRuntime) corev1.PodStatus {
	pod := rt.pod
	var statuses []corev1.ContainerStatus
	allReady := true
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, RestartCount: rt.restarts[c.Name]}
		if p := rt.procs[c.Name]; p != nil {
			if running, _, startedAt, _ := p.state(); running {
				cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(startedAt.Truncate(time.Second))}
				cs.Ready, cs.Started = true, ptr.To(true)
			}
		}
		if last := rt.lastExit[c.Name]; last != nil {
			if cs.State.Running != nil {
				cs.LastTerminationState.Terminated = last
			} else if shouldRestart(pod.Spec.RestartPolicy, int(last.ExitCode)) {
				cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
					Message: fmt.Sprintf("back-off restarting %s", c.Name)}
				cs.LastTerminationState.Terminated = last
			} else {
				cs.State.Terminated = last
			}
		}
		if cs.State.Running == nil && cs.State.Waiting == nil && cs.State.Terminated == nil {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
		allReady = allReady && cs.Ready
		statuses = append(statuses, cs)
	}
	phase := podPhase(pod.Spec.RestartPolicy, statuses)
	start := metav1.NewTime(rt.started.Truncate(time.Second))
	containersReady := corev1.ConditionFalse
	if allReady && phase == corev1.PodRunning {
		containersReady = corev1.ConditionTrue
	}
	conds := []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue},
		{Type: corev1.ContainersReady, Status: containersReady},
		{Type: corev1.PodReady, Status: podReady(containersReady, pod)},
	}
	for i := range conds {
		conds[i].LastTransitionTime = transitionTime(pod.Status.Conditions, conds[i])
	}
	sort.Slice(statuses, func(i, j int) bool { return statuses[i].Name < statuses[j].Name })
	return corev1.PodStatus{Phase: phase, Conditions: conds, ContainerStatuses: statuses,
		HostIP: "127.0.0.1", PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}}, StartTime: &start}
}

// podReady is a pod's Ready condition, as a kubelet makes it: its containers ready, and each of its readiness
// gates' conditions true (no one sets those of the pod's own status here: a static pod's has none).
func podReady(containersReady corev1.ConditionStatus, pod *corev1.Pod) corev1.ConditionStatus {
	for _, g := range pod.Spec.ReadinessGates {
		if !slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == g.ConditionType && c.Status == corev1.ConditionTrue
		}) {
			return corev1.ConditionFalse
		}
	}
	return containersReady
}

// transitionTime keeps a condition's transition time while its status is unchanged.
func transitionTime(old []corev1.PodCondition, c corev1.PodCondition) metav1.Time {
	for _, o := range old {
		if o.Type == c.Type && o.Status == c.Status && !o.LastTransitionTime.IsZero() {
			return o.LastTransitionTime
		}
	}
	return metav1.Now().Rfc3339Copy()
}

// finishDeletion stops the pod's processes within its grace period, then removes the pod object by UID: a
// same-name replacement may already exist and must not be touched.
func (n *Node) finishDeletion(ctx context.Context, rt *podRuntime, grace time.Duration) {
	stopProcesses(rt, grace)
	rt.mu.Lock()
	pod := rt.pod
	rt.mu.Unlock()
	// Cut off: finish once the API server is back.
	_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		err := n.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		return err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err), nil
	})
}

func stopProcesses(rt *podRuntime, grace time.Duration) {
	rt.mu.Lock()
	procs := make([]*process, 0, len(rt.procs))
	for _, p := range rt.procs {
		procs = append(procs, p)
	}
	rt.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func(p *process) {
			defer wg.Done()
			p.stop(grace)
		}(p)
	}
	wg.Wait()
}

func (n *Node) stopAll() {
	for _, rt := range n.runtimesWhere(nil) {
		stopProcesses(rt, 2*time.Second)
	}
}

func (n *Node) podFile(uid types.UID) string {
	return filepath.Join(n.cfg.StateDir, "pods", string(uid)+".json")
}

// savePod keeps the pod on disk so a restarted node runs it again without the API server (edge autonomy).
func (n *Node) savePod(pod *corev1.Pod) {
	if data, err := json.Marshal(pod); err == nil {
		_ = os.WriteFile(n.podFile(pod.UID), data, 0o644)
	}
}

// restoreRestartCounts carries a pod's restart counts across the node's restart, as the runtime's container
// attempts do: a container that ran when the node stopped counts one restart more when it starts again.
func (n *Node) restoreRestartCounts(pod *corev1.Pod) {
	n.mu.Lock()
	rt := n.pods[pod.UID]
	n.mu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, cs := range pod.Status.ContainerStatuses {
		rt.restarts[cs.Name] = cs.RestartCount
		if cs.State.Running != nil {
			rt.restarts[cs.Name]++
		}
	}
}

func (n *Node) loadPods() {
	files, _ := filepath.Glob(filepath.Join(n.cfg.StateDir, "pods", "*.json"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pod := &corev1.Pod{}
		if !staticPodFile(data) && json.Unmarshal(data, pod) == nil && pod.Spec.NodeName == n.cfg.NodeName {
			n.upsert(pod)
			n.restoreRestartCounts(pod)
		}
	}
}
