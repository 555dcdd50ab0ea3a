package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// agentRenderings are the agent's DaemonSet as the plain manifests and the chart, in both identity modes, have it.
func agentRenderings(t *testing.T) map[string]*appsv1.DaemonSet {
	t.Helper()
	caFile, _ := testCA(t, "kubeedge")
	out := map[string]*appsv1.DaemonSet{}
	for name, objs := range map[string][]*unstructured.Unstructured{
		manifestsFile:                      readManifests(t),
		"the chart, KubeEdge certificates": renderChart(t, "--set-file", "nodeIdentity.kubeedgeCA="+caFile),
		"the chart, passwords":             renderChart(t, "--set", "nodeIdentity.mode=password"),
	} {
		out[name] = mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent")
	}
	return out
}

// The agent runs on every edge node with the host's network and the node's CRI socket: its container is
// confined by the runtime's default seccomp profile, holds no capability, cannot gain privileges, cannot
// write its image, and serves metrics on the node's loopback only.
func TestAgentDaemonSetIsConfined(t *testing.T) {
	for name, ds := range agentRenderings(t) {
		t.Run(name, func(t *testing.T) {
			if len(ds.Spec.Template.Spec.Containers) != 1 {
				t.Fatalf("%d containers, want the agent alone", len(ds.Spec.Template.Spec.Containers))
			}
			c := ds.Spec.Template.Spec.Containers[0]
			sc := c.SecurityContext
			if sc == nil {
				t.Fatal("the agent's container has no securityContext")
			}
			seccomp := sc.SeccompProfile
			if seccomp == nil && ds.Spec.Template.Spec.SecurityContext != nil {
				seccomp = ds.Spec.Template.Spec.SecurityContext.SeccompProfile
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("seccomp profile %v, want RuntimeDefault", seccomp)
			}
			if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
				t.Errorf("capabilities %+v, want ALL dropped and none added", sc.Capabilities)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged != nil && *sc.Privileged {
				t.Error("the agent may gain privileges")
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("the agent's root filesystem is writable")
			}
			for _, arg := range c.Args {
				if value, ok := strings.CutPrefix(arg, "--metrics-address="); ok && value != "" && !strings.HasPrefix(value, "127.0.0.1:") {
					t.Errorf("metrics served on %s with the host's network, want 127.0.0.1", value)
				}
			}
			spec := ds.Spec.Template.Spec
			if spec.NodeSelector["node-role.kubernetes.io/edge"] != "" || len(spec.NodeSelector) != 1 {
				t.Errorf("nodeSelector %v, want the edge role alone", spec.NodeSelector)
			}
			for _, taint := range []string{"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"} {
				if !tolerates(spec.Tolerations, taint, corev1.TaintEffectNoExecute) {
					t.Errorf("tolerations %+v: the agent would be evicted by %s, when it is needed most", spec.Tolerations, taint)
				}
			}
			if !tolerates(spec.Tolerations, "node-role.kubernetes.io/edge", corev1.TaintEffectNoSchedule) {
				t.Errorf("tolerations %+v: not scheduled on edge nodes tainted with their role", spec.Tolerations)
			}
		})
	}
}

// tolerates says whether tolerations let a pod stay, for ever, on a node with that taint.
func tolerates(tolerations []corev1.Toleration, key string, effect corev1.TaintEffect) bool {
	for _, tol := range tolerations {
		if (tol.Key == key || tol.Key == "") && tol.Operator == corev1.TolerationOpExists &&
			(tol.Effect == effect || tol.Effect == "") && tol.TolerationSeconds == nil {
			return true
		}
	}
	return false
}

// The manifest matches real KubeEdge: no probe of cloudhub's websocket port, which requires a client
// certificate and would make every node look cut off; edgecore's configuration, which names cloudcore's HTTPS
// server, and the cloud's CA are mounted read-only for the default probe.
func TestAgentDaemonSetProbesCloudcoresHTTPSServer(t *testing.T) {
	for name, ds := range agentRenderings(t) {
		t.Run(name, func(t *testing.T) {
			c := ds.Spec.Template.Spec.Containers[0]
			edgecoreConfig := ""
			for _, arg := range c.Args {
				if probe, ok := strings.CutPrefix(arg, "--cloud-probe="); ok && strings.Contains(probe, ":10000") {
					t.Errorf("%s probes cloudhub's websocket port", arg)
				}
				if v, ok := strings.CutPrefix(arg, "--edgecore-config="); ok {
					edgecoreConfig = v
				}
			}
			if edgecoreConfig == "" {
				t.Fatal("no --edgecore-config: the agent cannot find cloudcore")
			}
			mounted := map[string]bool{}
			for _, m := range c.VolumeMounts {
				if m.ReadOnly {
					mounted[m.MountPath] = true
				}
			}
			if !mounted[edgecoreConfig] || !mounted["/etc/kubeedge/ca"] {
				t.Errorf("read-only mounts %v, want %s and /etc/kubeedge/ca", mounted, edgecoreConfig)
			}
		})
	}
}

// The agent shares the node's network: the kubelet (edged) asks its /healthz and /readyz on the node's loopback,
// at the port the agent serves them on (--health-address), which agent.probePort moves.
func TestAgentIsProbedOnTheNodesLoopback(t *testing.T) {
	renderings := agentRenderings(t)
	renderings["the chart, agent.probePort=9202"] = mustObject[appsv1.DaemonSet](t,
		renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "agent.probePort=9202"), "DaemonSet", "lifeline-agent")
	for name, ds := range renderings {
		t.Run(name, func(t *testing.T) {
			c := ds.Spec.Template.Spec.Containers[0]
			address := ""
			for _, arg := range c.Args {
				if v, ok := strings.CutPrefix(arg, "--health-address="); ok {
					address = v
				}
			}
			wantPort := "9102"
			if strings.Contains(name, "9202") {
				wantPort = "9202"
			}
			if address != "127.0.0.1:"+wantPort {
				t.Fatalf("--health-address=%q, want 127.0.0.1:%s", address, wantPort)
			}
			for _, p := range []struct {
				probe *corev1.Probe
				path  string
			}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("no HTTP probe of %s", p.path)
					continue
				}
				get := p.probe.HTTPGet
				if get.Host != "127.0.0.1" || get.Path != p.path || get.Port.String() != wantPort {
					t.Errorf("probe of %s asks %s:%s%s, want 127.0.0.1:%s%s", p.path, get.Host, get.Port.String(), get.Path, wantPort, p.path)
				}
				if p.probe.TimeoutSeconds < 1 || p.probe.PeriodSeconds < 1 || p.probe.FailureThreshold < 2 {
					t.Errorf("probe of %s: timeout %ds, period %ds, failure threshold %d: one slow answer must not fail it",
						p.path, p.probe.TimeoutSeconds, p.probe.PeriodSeconds, p.probe.FailureThreshold)
				}
			}
		})
	}
}

// On nodes whose kubelet is Kubernetes' own (agent.nodeDaemon=kubelet), the agent reads the API server with its
// service account's token, which only then is mounted and may read pods, rebuilds in the kubelet's staticPodPath,
// and mounts nothing of edgecore's, which such a node does not have (a hostPath of type File would keep the pod
// from starting).
func TestAgentOnKubeletNodesReadsTheAPIServerWithItsServiceAccount(t *testing.T) {
	objs := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "agent.nodeDaemon=kubelet")
	ds := mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent")
	spec := ds.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("no service-account token: the agent cannot read the API server")
	}
	args := strings.Join(spec.Containers[0].Args, " ")
	for _, want := range []string{"--in-cluster", "--static-pod-dir=/etc/kubernetes/manifests"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %s lack %s", args, want)
		}
	}
	for _, unwanted := range []string{"--edgecore-config", "--metaserver", "--api-server"} {
		if strings.Contains(args, unwanted) {
			t.Errorf("args %s hold %s, of edgecore", args, unwanted)
		}
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/etc/kubeedge") {
			t.Errorf("volume %s mounts %s, of edgecore", v.Name, v.HostPath.Path)
		}
	}
	role := mustObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "lifeline-agent")
	if len(role.Rules) != 1 || strings.Join(role.Rules[0].Resources, ",") != "pods" ||
		strings.Join(role.Rules[0].Verbs, ",") != "get,list,watch" {
		t.Errorf("the agent's ClusterRole %+v, want get, list and watch of pods alone", role.Rules)
	}
	if object[rbacv1.ClusterRole](t, renderChart(t, "--set", "nodeIdentity.mode=password"), "ClusterRole", "lifeline-agent") != nil {
		t.Error("on edgecore nodes without requireAuthorization the agent gets a ClusterRole it never uses")
	}
}

// On kubelet nodes the agent pod installs its standby, a static pod. A static pod that names a ServiceAccount,
// a ConfigMap or a Secret is refused by the API server (its mirror) and cannot be served by a cut-off node: the
// standby must need none of them, run the agent pod's image and flags, and be granted nothing but reading
// whether the agent's DaemonSet still exists.
func TestTheStandbyOnKubeletNodesIsAStaticPodThatNeedsNothingFromTheCloud(t *testing.T) {
	objs := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "agent.nodeDaemon=kubelet",
		"--set", "agent.kubelet.apiServer=https://10.0.0.1:6443", "--set", "agent.datasetDirs={/data}")
	ds := mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent")
	dsArgs := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(dsArgs, "--standby-manifest=/etc/lifeline/standby/pod.yaml") || !strings.Contains(dsArgs, "--daemonset="+namespace+"/lifeline-agent") {
		t.Errorf("the agent pod's args %s do not install the standby", dsArgs)
	}
	cm := mustObject[corev1.ConfigMap](t, objs, "ConfigMap", "lifeline-agent-standby")
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["pod.yaml"]), pod); err != nil {
		t.Fatalf("the standby's manifest: %v", err)
	}
	spec := pod.Spec
	if spec.ServiceAccountName != "" || !spec.HostNetwork || len(spec.Containers) != 1 {
		t.Errorf("standby: service account %q, host network %v, %d containers", spec.ServiceAccountName, spec.HostNetwork, len(spec.Containers))
	}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			t.Errorf("standby volume %s is not a node path: a static pod cannot have it", v.Name)
		}
	}
	c := spec.Containers[0]
	if c.Image != ds.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("standby image %s, the agent pod's %s", c.Image, ds.Spec.Template.Spec.Containers[0].Image)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--standby", "--cloud-probe=https://10.0.0.1:6443/readyz", "--ca-file=/var/lib/lifeline-agent/standby/broker-ca.crt",
		"--static-pod-dir=/etc/kubernetes/manifests", "--health-address=", "--metrics-address="} {
		if !strings.Contains(args, want) {
			t.Errorf("standby args %s lack %s", args, want)
		}
	}
	if strings.Contains(args, "--in-cluster") {
		t.Errorf("standby args %s read the API server, with no token", args)
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem ||
		len(c.SecurityContext.Capabilities.Drop) != 1 {
		t.Errorf("the standby runs with %+v, not the agent pod's locked-down context", c.SecurityContext)
	}
	role := mustObject[rbacv1.Role](t, objs, "Role", "lifeline-agent-standby")
	if len(role.Rules) != 1 || strings.Join(role.Rules[0].Verbs, ",") != "get" || strings.Join(role.Rules[0].ResourceNames, ",") != "lifeline-agent" {
		t.Errorf("the standby's Role %+v, want get of the agent's DaemonSet alone", role.Rules)
	}

	off := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "agent.nodeDaemon=kubelet", "--set", "agent.kubelet.standby=false")
	if object[corev1.ConfigMap](t, off, "ConfigMap", "lifeline-agent-standby") != nil ||
		strings.Contains(strings.Join(mustObject[appsv1.DaemonSet](t, off, "DaemonSet", "lifeline-agent").Spec.Template.Spec.Containers[0].Args, " "), "standby") {
		t.Error("agent.kubelet.standby=false still installs the standby")
	}
	if object[corev1.ConfigMap](t, renderChart(t, "--set", "nodeIdentity.mode=password"), "ConfigMap", "lifeline-agent-standby") != nil {
		t.Error("edgecore nodes, which start their pods from their own store, get a standby")
	}
}

// agent.armStandIns (on by default) has the agent pod, and the standby on kubelet nodes, arm stand-ins; off, the
// agent writes a stand-in at the rebuild.
func TestArmedStandInsAreOnByDefault(t *testing.T) {
	for _, daemon := range []string{"edgecore", "kubelet"} {
		off := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "agent.nodeDaemon="+daemon, "--set", "agent.armStandIns=false")
		if args := strings.Join(mustObject[appsv1.DaemonSet](t, off, "DaemonSet", "lifeline-agent").Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(args, "--arm-stand-ins") {
			t.Errorf("%s: stand-ins armed with agent.armStandIns=false: %s", daemon, args)
		}
		objs := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "agent.nodeDaemon="+daemon)
		c := mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent").Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--arm-stand-ins") {
			t.Errorf("%s: agent args %v do not arm stand-ins", daemon, c.Args)
		}
		if daemon != "kubelet" {
			continue
		}
		pod := &corev1.Pod{}
		if err := yaml.UnmarshalStrict([]byte(mustObject[corev1.ConfigMap](t, objs, "ConfigMap", "lifeline-agent-standby").Data["pod.yaml"]), pod); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pod.Spec.Containers[0].Args, "--arm-stand-ins") {
			t.Errorf("the standby's args %v do not open the gates the agent pod arms", pod.Spec.Containers[0].Args)
		}
	}
}
