package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// UpgradeOptions say what UpgradeWhileCutOff upgrades to, which node it cuts off meanwhile and whose workers it
// watches, so that kubelet and edgecore nodes run the same scenario.
type UpgradeOptions struct {
	// Tag is the new tag of both images, which the upgrade names without a digest. The images the release runs are
	// tagged so on every node first, as a registry serving a new tag would: the nodes have no registry to pull from.
	Tag string
	// CutNode is the edge node cut off from everything while the release is upgraded: its agent cannot be
	// replaced until the link returns, once the new controller is ready.
	CutNode string
	// Service is the JointInferenceService whose workers must run on undisturbed and whose edge worker's reports
	// must all arrive; its workers must run and report before the upgrade.
	Service client.ObjectKey
}

// Upgrade is what a helm upgrade did to the running workers and the agents: what the user of a cluster would see
// change, and what they must not lose.
type Upgrade struct {
	// Restarted are the workers whose pod or restart count changed, each with its pod before and after.
	Restarted []string
	// Lost are the workers' log lines on the reports they gave up on (Sedna's library: five attempts, 3 s apart).
	Lost []string
	// ReportsRetried counts the reports delivered after a retry: sent while an agent was being replaced.
	ReportsRetried int
	// HandOvers counts the new agents that found the old one running and took the node from it.
	HandOvers int
	// Agents is how many agents of the new release had to be ready: one per edge node.
	Agents int
	// Took is from the helm upgrade until every agent of the new release was ready.
	Took time.Duration
	// StandbyChecked says whether a node had a standby to look at: a kubelet edge node that stayed connected.
	// Only kubelet nodes run one (the chart's lifeline-agent-standby static pod); an edgecore node runs its pods
	// from its own store when it boots cut off, and has none.
	StandbyChecked bool
	// StandbyFollowed says whether the standby of every kubelet edge node that stayed connected names the new
	// tag; it is false, and means nothing, when StandbyChecked is false.
	StandbyFollowed bool
}

// UpgradeWhileCutOff upgrades the release to opts.Tag for both images while opts.CutNode is cut off from
// everything; it mends the node once the new controller is ready and returns when every agent of the new release
// is ready and the service's status shows reports sent through them. A worker restarted or a report lost is in
// the Upgrade, not an error: the error says the scenario could not be run.
func UpgradeWhileCutOff(ctx context.Context, c *Cluster, inst *Installation, kc client.Client, opts UpgradeOptions) (Upgrade, error) {
	before, err := runningWorkers(ctx, kc, opts.Service)
	if err != nil {
		return Upgrade{}, err
	}
	if len(before) == 0 {
		return Upgrade{}, fmt.Errorf("no worker of %s runs", opts.Service)
	}
	oldController, err := c.ComponentPods(ctx, "lifeline-controller")
	if err != nil {
		return Upgrade{}, err
	}
	// The edge worker's reports reach its agent: a lost one below is the upgrade's.
	var metricsBefore []v1alpha1.Metric
	if err := poll(ctx, time.Minute, "the edge worker's reports in the status of "+opts.Service.String(), func(ctx context.Context) (bool, error) {
		metrics, err := serviceMetrics(ctx, kc, opts.Service)
		metricsBefore = metrics
		return len(metrics) > 0, err
	}); err != nil {
		return Upgrade{}, err
	}
	if err := c.tagReleaseImages(ctx, opts.Tag); err != nil {
		return Upgrade{}, err
	}
	if err := c.Cut(ctx, opts.CutNode, LinkAll, inst.BrokerPort); err != nil {
		return Upgrade{}, fmt.Errorf("cutting off %s: %w", opts.CutNode, err)
	}
	defer func() { _ = c.Mend(context.WithoutCancel(ctx), opts.CutNode) }()
	upgraded := time.Now()
	if _, err := c.Helm(ctx, "upgrade", inst.Release, inst.Chart, "--reuse-values",
		"--set", "controller.image.tag="+opts.Tag, "--set", "agent.image.tag="+opts.Tag,
		"--set-string", "controller.image.digest=", "--set-string", "agent.image.digest="); err != nil {
		return Upgrade{}, err
	}
	if err := poll(ctx, 2*time.Minute, "a new controller pod ready", func(ctx context.Context) (bool, error) {
		pods, err := c.ComponentPods(ctx, "lifeline-controller")
		for name, ready := range pods {
			if _, old := oldController[name]; !old && ready {
				return true, nil
			}
		}
		return false, err
	}); err != nil {
		return Upgrade{}, err
	}
	// The cut node's agent cannot be replaced until the link returns.
	if err := c.Mend(ctx, opts.CutNode); err != nil {
		return Upgrade{}, fmt.Errorf("mending %s: %w", opts.CutNode, err)
	}
	u := Upgrade{Agents: len(c.nodesOf(RoleEdge))}
	if err := poll(ctx, 3*time.Minute, fmt.Sprintf("the %d agents of the new revision ready", u.Agents), func(ctx context.Context) (bool, error) {
		pods, err := c.componentPods(ctx, "lifeline-agent")
		ready := 0
		for i := range pods {
			if strings.HasSuffix(pods[i].Spec.Containers[0].Image, ":"+opts.Tag) && podReady(&pods[i]) {
				ready++
			}
		}
		return ready == u.Agents, err
	}); err != nil {
		return Upgrade{}, err
	}
	u.Took = time.Since(upgraded)
	if err := poll(ctx, 30*time.Second, "reports through the new agents", func(ctx context.Context) (bool, error) {
		metrics, err := serviceMetrics(ctx, kc, opts.Service)
		return err == nil && !equality.Semantic.DeepEqual(metrics, metricsBefore), err
	}); err != nil {
		return Upgrade{}, err
	}
	if u.HandOvers, err = c.handOvers(ctx); err != nil {
		return Upgrade{}, err
	}
	u.StandbyChecked, u.StandbyFollowed = c.standbysFollowed(opts)
	after, err := runningWorkers(ctx, kc, opts.Service)
	if err != nil {
		return Upgrade{}, err
	}
	now := map[string]workerRun{}
	for i := range after {
		now[after[i].Name] = workerRunOf(&after[i])
	}
	for i := range before {
		w := workerRunOf(&before[i])
		if later, ok := now[before[i].Name]; !ok || w.restartedBy(later) {
			u.Restarted = append(u.Restarted, fmt.Sprintf("%s: %s before, %s after", before[i].Name, w, later))
		}
	}
	// The edge worker reports every 3 s, as Sedna's library does, trying a report again while no agent answers.
	for i := range after {
		logs, err := c.podLogs(&after[i], upgraded)
		if err != nil {
			return Upgrade{}, err
		}
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "report lost") {
				u.Lost = append(u.Lost, after[i].Name+": "+l)
			}
		}
		u.ReportsRetried += strings.Count(logs, "report delivered at attempt")
	}
	return u, nil
}

// tagReleaseImages gives the images the release's controller and agents run the tag on every node, as a registry
// serving the same images under a new tag would.
func (c *Cluster) tagReleaseImages(ctx context.Context, tag string) error {
	for _, name := range []string{"lifeline-controller", "lifeline-agent"} {
		image, err := c.releaseImage(ctx, name)
		if err != nil {
			return err
		}
		tagged, _, _ := strings.Cut(image, "@") // repository:tag, its digest left out
		repository := tagged[:strings.LastIndex(tagged, ":")]
		for _, n := range c.Nodes {
			if err := n.TagImage(ctx, "docker.io/"+tagged, "docker.io/"+repository+":"+tag); err != nil {
				return err
			}
		}
	}
	return nil
}

// releaseImage is the image the Deployment or DaemonSet name of the release runs, as its pod template names it.
func (c *Cluster) releaseImage(ctx context.Context, name string) (string, error) {
	apps := c.client.AppsV1()
	if d, err := apps.Deployments(Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
		return d.Spec.Template.Spec.Containers[0].Image, nil
	}
	ds, err := apps.DaemonSets(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the image of %s: %w", name, err)
	}
	return ds.Spec.Template.Spec.Containers[0].Image, nil
}

// handOvers counts the agent pods, those being deleted left out, whose log says they waited for the agent pod
// they replace to give up the node.
func (c *Cluster) handOvers(ctx context.Context) (int, error) {
	pods, err := c.componentPods(ctx, "lifeline-agent")
	if err != nil {
		return 0, err
	}
	count := 0
	for i := range pods {
		if pods[i].DeletionTimestamp != nil {
			continue
		}
		logs, err := c.podLogs(&pods[i], time.Time{})
		if err != nil {
			return 0, err
		}
		if strings.Contains(logs, "or the agent pod it replaces, to give way") {
			count++
		}
	}
	return count, nil
}

// standbyManifest is the agent's standby in a kubelet node's StaticPodDir, which the agent pod installs.
const standbyManifest = "lifeline-agent-standby.yaml"

// standbysFollowed reads the standby manifest of every kubelet edge node but the cut one: checked says whether
// there was such a node, followed whether each of their standbys names the new tag (a manifest missing does not).
func (c *Cluster) standbysFollowed(opts UpgradeOptions) (checked, followed bool) {
	followed = true
	for _, n := range c.nodesOf(RoleEdge) {
		if n.Daemon != DaemonKubelet || n.Name == opts.CutNode {
			continue
		}
		checked = true
		manifest, err := os.ReadFile(n.onDisk(filepath.Join(StaticPodDir, standbyManifest)))
		followed = followed && err == nil && strings.Contains(string(manifest), ":"+opts.Tag)
	}
	return checked, checked && followed
}

// nodesOf are the cluster's nodes of a role, in their order.
func (c *Cluster) nodesOf(role Role) []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if n.Role == role {
			out = append(out, n)
		}
	}
	return out
}

// runningWorkers are the service's worker pods that run; a stand-in's mirror pod is no worker, as the agent arms
// a new one at will.
func runningWorkers(ctx context.Context, kc client.Client, service client.ObjectKey) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := kc.List(ctx, pods, client.InNamespace(service.Namespace),
		client.MatchingLabels{"jointinferenceservice.sedna.io/name": service.Name}); err != nil {
		return nil, fmt.Errorf("listing the workers of %s: %w", service, err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && !contract.IsMirrorPod(&p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// workerRun is what changes when a worker is restarted: its pod's UID, or its containers' restart count.
type workerRun struct {
	uid      string
	restarts int32
}

func workerRunOf(p *corev1.Pod) workerRun {
	w := workerRun{uid: string(p.UID)}
	for _, cs := range p.Status.ContainerStatuses {
		w.restarts += cs.RestartCount
	}
	return w
}

// restartedBy: later is another pod, or the same restarted. A count that went down is no restart: a node that
// rebooted posts its containers' counts anew, from 0, some time after (edgecore: once its link is back).
func (w workerRun) restartedBy(later workerRun) bool {
	return later.uid != w.uid || later.restarts > w.restarts
}

func (w workerRun) String() string {
	if w.uid == "" {
		return "no pod"
	}
	return fmt.Sprintf("uid %s restarts %d", w.uid, w.restarts)
}

// serviceMetrics are the metrics in the service's status: its edge worker's reports, through its agent.
func serviceMetrics(ctx context.Context, kc client.Client, service client.ObjectKey) ([]v1alpha1.Metric, error) {
	ji := &v1alpha1.JointInferenceService{}
	if err := kc.Get(ctx, service, ji); err != nil {
		return nil, fmt.Errorf("reading %s: %w", service, err)
	}
	return ji.Status.Metrics, nil
}

// poll asks cond every 100 ms until it holds, for at most within. An error of cond is not the end, as a cluster
// being changed answers some requests with one; the last is said if the time runs out.
func poll(ctx context.Context, within time.Duration, what string, cond func(context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	switch {
	case err == nil:
		return nil
	case last != nil:
		return fmt.Errorf("waiting %v for %s: %w (last: %v)", within, what, err, last)
	default:
		return fmt.Errorf("waiting %v for %s: %w", within, what, err)
	}
}
