package deploy

import (
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// agentDaemonSet decodes the DaemonSet of deploy/agent/agent.yaml.
func agentDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	data, err := os.ReadFile("agent/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var ds appsv1.DaemonSet
		if err := yaml.UnmarshalStrict([]byte(doc), &ds); err == nil && ds.Kind == "DaemonSet" {
			return &ds
		}
	}
	t.Fatal("no DaemonSet in agent/agent.yaml")
	return nil
}

// The agent runs on every edge node with the host's network and the node's CRI socket: its container is
// confined by the runtime's default seccomp profile, holds no capability, cannot gain privileges, cannot
// write its image, and serves metrics on the node's loopback only.
func TestAgentDaemonSetIsConfined(t *testing.T) {
	ds := agentDaemonSet(t)
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
}

// The manifest matches real KubeEdge: no probe of cloudhub's websocket port, which requires a client
// certificate and would make every node look cut off; edgecore's configuration, which names cloudcore's HTTPS
// server, and the cloud's CA are mounted read-only for the default probe.
func TestAgentDaemonSetProbesCloudcoresHTTPSServer(t *testing.T) {
	ds := agentDaemonSet(t)
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
}
