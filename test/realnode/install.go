package realnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Namespace is where Lifeline is installed.
const Namespace = "lifeline-system"

// BrokerNodePort is the chart's default NodePort of the broker, which the agents dial on the cloud node.
const BrokerNodePort = 30883

// InstallOptions say what to install.
type InstallOptions struct {
	// Chart is the packaged chart installed (Release's).
	Chart string
	// Values are further --set values.
	Values []string
	// Progress receives a line per step; nil means os.Stderr.
	Progress io.Writer
}

// Installation is Lifeline as installed.
type Installation struct {
	// BrokerPort is the port the agents dial the broker at.
	BrokerPort int
	// Release is the Helm release's name.
	Release string
	// Chart is the chart the release was installed from, which an upgrade names again.
	Chart string
}

// InstallLifeline installs the packaged chart as docs/operations.md tells users, the release's images already on
// the nodes, then waits until the controller and one agent per edge node are ready: with the chart's defaults on
// KubeEdge nodes, for kubelet nodes with nodes logging in with passwords.
func InstallLifeline(ctx context.Context, c *Cluster, opts InstallOptions) (*Installation, error) {
	out := opts.Progress
	if out == nil {
		out = os.Stderr
	}
	inst := &Installation{BrokerPort: BrokerNodePort, Release: "lifeline", Chart: opts.Chart}
	client := c.client
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}
	var cloud *Node
	for _, n := range c.Nodes {
		if n.Role == RoleCloud && cloud == nil {
			cloud = n
		}
	}
	if cloud == nil {
		return nil, fmt.Errorf("no cloud node to run the controller")
	}
	args := []string{"install", inst.Release, inst.Chart,
		"--set", "broker.advertiseAddress={" + cloud.nodeIP() + "}",
		"--set", "controller.image.pullPolicy=Never", "--set", "agent.image.pullPolicy=Never",
		"--wait", "--timeout", "90s"}
	var err error
	if c.cloudcore != nil {
		args, err = c.kubeedgeValues(ctx, args)
	} else {
		args, err = c.kubeletValues(ctx, args)
	}
	if err != nil {
		return nil, err
	}
	for _, v := range opts.Values {
		args = append(args, "--set", v)
	}
	fmt.Fprintf(out, "real nodes: helm %s\n", strings.Join(args, " "))
	began := time.Now()
	if _, err := c.Helm(ctx, args...); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "real nodes: Lifeline installed, controller and agents ready (%.0fs)\n", time.Since(began).Seconds())
	return inst, nil
}

// Helm runs the cluster's helm with args on Lifeline's namespace, as its admin, and returns what it printed. Its
// error holds that output and what in the namespace is not running.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "helm"), append(args, "--kubeconfig", c.Kubeconfig, "--namespace", Namespace)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s\n%s", strings.Join(args, " "), err, out, c.Diagnose(ctx, Namespace))
	}
	return string(out), nil
}

// kubeedgeValues are the chart's defaults for KubeEdge nodes: each node logs in to the broker with the
// certificate cloudcore issued it, checked against KubeEdge's CA, which docs/operations.md takes from the Secret
// kubeedge/casecret.
func (c *Cluster) kubeedgeValues(ctx context.Context, args []string) ([]string, error) {
	secret, err := c.client.CoreV1().Secrets("kubeedge").Get(ctx, "casecret", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading KubeEdge's CA: %w", err)
	}
	ca := filepath.Join(c.dir, "kubeedge-ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secret.Data["cadata"]}), 0o644); err != nil {
		return nil, err
	}
	return append(args, "--set-file", "nodeIdentity.kubeedgeCA="+ca), nil
}

// kubeletValues are those of kubelet nodes logging in with passwords (each edge node's in
// /etc/lifeline/mqtt-password, all in the Secret lifeline-mqtt-credentials).
func (c *Cluster) kubeletValues(ctx context.Context, args []string) ([]string, error) {
	client := c.client
	passwords := map[string]string{}
	for _, n := range c.Nodes {
		if n.Role != RoleEdge {
			continue
		}
		secret := make([]byte, 24)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
		passwords[n.Name] = hex.EncodeToString(secret)
		if err := os.WriteFile(n.onDisk("/etc/lifeline/mqtt-password"), []byte(passwords[n.Name]+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("provisioning node %s's MQTT password: %w", n.Name, err)
		}
	}
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "lifeline-mqtt-credentials", Namespace: Namespace},
		StringData: passwords}
	if _, err := client.CoreV1().Secrets(Namespace).Create(ctx, creds, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating the MQTT credentials: %w", err)
	}
	return append(args, "--set", "nodeIdentity.mode=password", "--set", "agent.nodeDaemon=kubelet"), nil
}

// Diagnose describes what in the namespace is not running, for an error: each pod's phase, node and waiting or
// terminated containers, and the namespace's latest Warning events.
func (c *Cluster) Diagnose(ctx context.Context, namespace string) string {
	var b strings.Builder
	pods, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "listing pods: " + err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Waiting != nil:
				fmt.Fprintf(&b, "; %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case cs.State.Terminated != nil:
				fmt.Fprintf(&b, "; %s terminated: %s (exit %d)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
			case !cs.Ready:
				fmt.Fprintf(&b, "; %s running, not ready (restarts %d)", cs.Name, cs.RestartCount)
			}
		}
		b.WriteString("\n")
	}
	events, err := c.client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		items := events.Items
		if len(items) > 15 {
			items = items[len(items)-15:]
		}
		for _, e := range items {
			fmt.Fprintf(&b, "event %s %s/%s: %s\n", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
		}
	}
	return b.String()
}

// componentPods are the pods of a component of the release (app.kubernetes.io/name=component, as
// lifeline-controller or lifeline-agent), those being deleted among them.
func (c *Cluster) componentPods(ctx context.Context, component string) ([]corev1.Pod, error) {
	pods, err := c.client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + component})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of %s: %w", component, err)
	}
	return pods.Items, nil
}

// ComponentPods tells, by name, whether each pod of a component of the release (lifeline-controller,
// lifeline-agent) is ready; pods being deleted are left out, as they are the ones on their way out.
func (c *Cluster) ComponentPods(ctx context.Context, component string) (map[string]bool, error) {
	pods, err := c.componentPods(ctx, component)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for i := range pods {
		if pods[i].DeletionTimestamp == nil {
			out[pods[i].Name] = podReady(&pods[i])
		}
	}
	return out, nil
}

// ComponentLogs is the log of every pod of a component of the release (lifeline-agent, lifeline-controller), every
// run of its containers, for a failure's message. It is read from the nodes' disks, so that it is there for a node
// cut off and for an edgecore node alike; what cannot be read says why in its place.
func (c *Cluster) ComponentLogs(ctx context.Context, component string) string {
	pods, err := c.componentPods(ctx, component)
	if err != nil {
		return err.Error()
	}
	var out strings.Builder
	for i := range pods {
		logs, err := c.podLogs(&pods[i], time.Time{})
		if err != nil {
			logs = err.Error() + "\n"
		}
		fmt.Fprintf(&out, "== %s on %s\n%s", pods[i].Name, pods[i].Spec.NodeName, logs)
	}
	return out.String()
}

// podReady tells whether the pod's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// exampleFiles are the files deploy/examples' Models and Datasets name on the nodes that run their workers: the
// models of the joint inference example (a placeholder each: the sample workers load nothing), and each edge node's
// Dataset index of the federated learning example.
func exampleFiles(role Role) map[string]string {
	if role == RoleCloud {
		return map[string]string{
			"/data/models/helmet/big/yolov3_darknet.pb": "sample model\n",
			"/data/models/surface-defects/.keep":        "",
		}
	}
	var index strings.Builder
	for i := range 20 {
		fmt.Fprintf(&index, "images/%03d.jpeg %d\n", i, i%2)
	}
	return map[string]string{
		"/data/models/helmet/little/yolov3_resnet18.pb": "sample model\n",
		"/data/surface-defects/train_index.txt":         index.String(),
		"/data/models/surface-defects/.keep":            "",
	}
}

// PlaceExampleFiles puts on every node the files deploy/examples name there, as a user would before applying them.
func PlaceExampleFiles(c *Cluster) error {
	for _, n := range c.Nodes {
		for path, content := range exampleFiles(n.Role) {
			if err := n.WriteFile(path, []byte(content)); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteFile writes a file at path on the node's disk, making its directories.
func (n *Node) WriteFile(path string, data []byte) error {
	file := n.onDisk(path)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// FixtureVars are the node names the examples in deploy/examples take on these nodes.
var FixtureVars = map[string]string{"EDGE_NODE": "edge-1", "EDGE_NODE_1": "edge-1", "EDGE_NODE_2": "edge-2", "CLOUD_NODE": "cloud-1"}

// ImageArchive is an OCI image archive imported into every node's containerd.
type ImageArchive struct {
	Path string
	// Repository, when set, names the image by its digest too (docker.io/<repository>@sha256:…), as
	// docs/operations.md tells users to import a release's images: its chart runs them by digest, which containerd
	// finds only under such a name.
	Repository string
}

// Release is what `make images-nodes` leaves in a checkout: the release that the real nodes install (its images
// for this machine's platform) and the sample images their workers run.
type Release struct {
	// Chart is the packaged chart, its images pinned to their digests.
	Chart  string
	Images []ImageArchive
}

// FindRelease finds the release and the sample images in the checkout repo, or says how to make them.
func FindRelease(repo string) (Release, error) {
	charts, _ := filepath.Glob(filepath.Join(repo, "dist/release/lifeline-*.tgz"))
	images, _ := filepath.Glob(filepath.Join(repo, "dist/release/images/*.tar"))
	samples, _ := filepath.Glob(filepath.Join(repo, "dist/images/samples/*.tar"))
	if len(charts) != 1 || len(images) == 0 || len(samples) == 0 {
		return Release{}, fmt.Errorf("no release and sample images in %s (charts %d, images %d, samples %d): run make images-nodes first",
			filepath.Join(repo, "dist"), len(charts), len(images), len(samples))
	}
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(charts[0]), "lifeline-"), ".tgz")
	rel := Release{Chart: charts[0]}
	for _, path := range images {
		name := strings.TrimSuffix(filepath.Base(path), "-"+version+".tar")
		rel.Images = append(rel.Images, ImageArchive{Path: path, Repository: "docker.io/lifeline/" + name})
	}
	for _, path := range samples {
		rel.Images = append(rel.Images, ImageArchive{Path: path})
	}
	return rel, nil
}
