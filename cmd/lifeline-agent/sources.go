package main

import (
	"fmt"
	"path/filepath"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/agent"
	"github.com/lifeline-edge/lifeline/edge/cloudlink"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/standby"
	"github.com/lifeline-edge/lifeline/edge/standin"
)

// NodeSources are where the agent learns the node's desired workers, how it rebuilds one the node lost, and how
// it tells whether the node reaches the API server: the agent pod's pod source and probe, or the standby's disk.
type NodeSources struct {
	Workers *desired.Watcher
	// Rebuilder is nil when the agent must not rebuild (ChooseRebuilder).
	Rebuilder agent.Rebuilder
	// Probe is the cloud probe, nil for none; RunProbe says the agent runs it (the standby's already runs).
	Probe    *cloudlink.Probe
	RunProbe bool
	// ActuatorURL is the MetaServer restarts go through; empty: the runtime only.
	ActuatorURL string
	// PodSourceURL names the pod source in the logs and the readiness probe.
	PodSourceURL string
	// APIReachable says whether the node reaches the API server now, APIKnown whether that is known yet.
	APIReachable, APIKnown func() bool
}

// PodSourceFlags are the agent pod's flags that choose its pod source, its probe and its rebuilds.
type PodSourceFlags struct {
	InCluster                             bool
	Kubeconfig, APIServer, EdgecoreConfig string
	APIServerExplicit                     bool
	MetaServer                            string
	MetaServerExplicit                    bool
	CloudProbe, CloudProbeCA              string
	StaticDir                             string
	AllowInsecurePods                     bool
	// InsecureHostPaths are the node directories below which a stand-in from an unauthenticated source may mount
	// node paths (standin.Bound.HostPathRoots); HostRoot is where the node's root is in the agent's container.
	InsecureHostPaths []string
	HostRoot          string
	// GateBinary, when set, arms stand-ins ahead (standin.StaticPods.GateBinary).
	GateBinary string
	// Word, when set, is the controller's word on the node's workers: the pod source on a KubeEdge node
	// (UsesControllerWord), MetaServer or not.
	Word *desired.ControllerWord
}

// Pod sources the agent's --pod-source names.
const (
	// PodSourceAuto: the controller's word on a KubeEdge node (edgecore's configuration given, no API server or
	// MetaServer named), the API server elsewhere.
	PodSourceAuto = "auto"
	// PodSourceController: the controller's word, over the broker session [P-DES-1].
	PodSourceController = "controller"
	// PodSourceAPI: the API server or MetaServer the other flags name.
	PodSourceAPI = "api"
)

// UsesControllerWord tells whether the agent reads its workers from the controller's word (--pod-source).
func (f PodSourceFlags) UsesControllerWord(podSource string) bool {
	switch podSource {
	case PodSourceController:
		return true
	case PodSourceAuto:
		return !f.InCluster && f.Kubeconfig == "" && !f.APIServerExplicit && !f.MetaServerExplicit && f.EdgecoreConfig != ""
	}
	return false
}

// ProtectedPaths are the node paths no rebuilt worker may mount besides standin.SystemPaths: the agent's state, the
// runtime's socket directory and edgecore's configuration directory.
func ProtectedPaths(stateDir, criSocket, edgecoreConfig string) []string {
	return []string{stateDir, filepath.Dir(criSocket), filepath.Dir(edgecoreConfig)}
}

// PodSources are the agent pod's sources: the node's pods from the API server or the MetaServer as flags choose
// (ChoosePods), rebuilds only from an authenticated source (ChooseRebuilder), and the cloud probe (ChooseProbe).
// The workers' watcher logs to watcherLog (its retries are the readiness probe's evidence).
func PodSources(node, stateDir string, protected []string, f PodSourceFlags, log, watcherLog logr.Logger) (NodeSources, error) {
	source, err := ChoosePods(f.InCluster, f.Kubeconfig, f.APIServer, f.APIServerExplicit, f.EdgecoreConfig, f.MetaServer,
		f.MetaServerExplicit, log.WithName("pods"))
	if err != nil {
		return NodeSources{}, fmt.Errorf("configuring where the node's pods are read: %w", err)
	}
	if f.Word != nil {
		// Restarts still go where ChoosePods says (a MetaServer, else the runtime); the workers and their
		// stand-ins are the controller's word alone.
		source.Pods = f.Word
		log.Info("the node's workers are the controller's word, over the broker session", "trusted", f.Word.Authenticated())
	}
	workers, err := desired.New(source.Pods, node, stateDir, watcherLog)
	if err != nil {
		return NodeSources{}, fmt.Errorf("loading the desired workers: %w", err)
	}
	probe, err := ChooseProbe(f.CloudProbe, f.CloudProbeCA, f.InCluster, f.EdgecoreConfig, log.WithName("probe"))
	if err != nil {
		return NodeSources{}, err
	}
	var rebuilder agent.Rebuilder
	bound := standin.Bound{Protected: protected, HostPathRoots: f.InsecureHostPaths, HostRoot: f.HostRoot}
	if pods := ChooseRebuilder(source.Pods, f.StaticDir, f.AllowInsecurePods, workers, bound, log); pods != nil {
		pods.GateBinary, pods.GatesDir = f.GateBinary, standin.GatesDir(stateDir)
		rebuilder = pods
	}
	return NodeSources{Workers: workers, Rebuilder: rebuilder,
		Probe: probe, RunProbe: probe != nil, ActuatorURL: source.ActuatorURL, PodSourceURL: source.Pods.URL(),
		APIReachable: APIReachability(workers, probe), APIKnown: APIReachabilityKnown(workers, probe)}, nil
}

// The agent finds StaticPods' Arm by a type assertion: a signature that drifts must not compile.
var _ agent.Armer = (*standin.StaticPods)(nil)

// StandbySources are the standby's: it reads no API server (a static pod has no credentials), only the desired
// workers the agent pod left on the node's disk, which came from the agent pod's authenticated source, so it
// rebuilds them; whether the node reaches the API server is its running probe's word alone.
func StandbySources(node, stateDir, staticDir, gateBinary string, protected []string, probe *cloudlink.Probe, watcherLog logr.Logger) (NodeSources, error) {
	workers, err := desired.New(standby.Source{}, node, stateDir, watcherLog)
	if err != nil {
		return NodeSources{}, fmt.Errorf("loading the desired workers: %w", err)
	}
	rebuilder := &standin.StaticPods{Dir: staticDir, Workers: workers, Bound: standin.Bound{Protected: protected}, GateBinary: gateBinary, GatesDir: standin.GatesDir(stateDir)}
	return NodeSources{Workers: workers, Rebuilder: rebuilder,
		Probe: probe, PodSourceURL: "none (the standby)", APIReachable: probe.Reachable, APIKnown: probe.Probed}, nil
}
