package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/cloudlink"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/restart"
	"github.com/lifeline-edge/lifeline/edge/standin"
)

// PodSource is where the node's workers are read: an API server, a MetaServer, or the controller's word.
type PodSource interface {
	desired.PodSource
	// Authenticated tells whether no process of the node can answer in the source's place: only then are
	// stand-ins written from its pods unbounded.
	Authenticated() bool
	// URL names the source in the logs and the readiness probe.
	URL() string
}

// PodsSource is where the node's pods are read, and where ACTION_RESTART goes first.
type PodsSource struct {
	Pods PodSource
	// ActuatorURL is the MetaServer restarts go through; empty: through the runtime only.
	ActuatorURL string
}

// ChoosePods is the pod client for the node's workers. A kubeconfig wins; else an explicit apiServer; else the
// MetaServer as edgecore's configuration at edgecoreConfig sets it up (empty: apiServer as given). Under the
// requireAuthorization feature gate the MetaServer serves HTTPS with a certificate of the API server's CA and
// takes a service-account token (it authenticates no client certificate): the agent sends its pod's token, and
// restarts go through the runtime unless actuatorExplicit: the agent's account may only read pods.
func ChoosePods(inCluster bool, kubeconfig, apiServer string, apiServerExplicit bool, edgecoreConfig, actuatorURL string, actuatorExplicit bool,
	log logr.Logger) (PodsSource, error) {
	if inCluster {
		pods, err := desired.InClusterPodClient()
		if err != nil {
			return PodsSource{}, fmt.Errorf("reading the API server from the pod: %w", err)
		}
		log.Info("the node's pods are read from the API server with the pod's service account", "url", pods.URL())
		// A kubelet node has no MetaServer to restart through: the runtime restarts.
		return PodsSource{Pods: pods}, nil
	}
	if kubeconfig != "" {
		pods, err := desired.PodClientFromKubeconfig(kubeconfig)
		if err != nil {
			return PodsSource{}, fmt.Errorf("loading the API server's configuration: %w", err)
		}
		return PodsSource{Pods: pods, ActuatorURL: actuatorURL}, nil
	}
	if apiServerExplicit || edgecoreConfig == "" {
		return PodsSource{Pods: desired.NewPodClient(apiServer, nil, ""), ActuatorURL: actuatorURL}, nil
	}
	ep, err := cloudlink.EdgecoreMetaServer(edgecoreConfig)
	if err != nil {
		log.Info("edgecore's configuration not read: the MetaServer is assumed at its default", "url", apiServer, "reason", err.Error())
		return PodsSource{Pods: desired.NewPodClient(apiServer, nil, ""), ActuatorURL: actuatorURL}, nil
	}
	if !ep.Enabled {
		log.Info("edgecore's MetaServer is not enabled (modules.metaManager.metaServer.enable): the node's pods cannot be read until it is",
			"config", edgecoreConfig)
	}
	if ep.CAFile == "" {
		if !actuatorExplicit {
			actuatorURL = ep.URL
		}
		return PodsSource{Pods: desired.NewPodClient(ep.URL, nil, ""), ActuatorURL: actuatorURL}, nil
	}
	pem, err := os.ReadFile(ep.CAFile)
	pool := x509.NewCertPool()
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		return PodsSource{}, fmt.Errorf("reading the MetaServer's CA %s (requireAuthorization is on): %v", ep.CAFile, err)
	}
	if !actuatorExplicit {
		actuatorURL = ""
	}
	log.Info("the MetaServer requires authorization: HTTPS with the pod's service-account token", "url", ep.URL, "ca", ep.CAFile)
	pods := desired.NewPodClient(ep.URL, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, "").WithTokenFile(desired.InClusterTokenFile)
	return PodsSource{Pods: pods, ActuatorURL: actuatorURL}, nil
}

// ChooseRebuilder is the static-pod rebuilder of workers the node lost, or nil when the agent must not rebuild:
// no static-pod directory, or an unauthenticated pod source (a plain-HTTP MetaServer, the controller's word over a
// session without TLS) unless allowInsecure, and then each stand-in is held to bound as an untrusted one
// (standin.Bound.Untrusted). bound's Protected are node paths no stand-in may mount, beside standin.SystemPaths and
// staticDir.
func ChooseRebuilder(pods PodSource, staticDir string, allowInsecure bool, workers standin.DesiredWorkers, bound standin.Bound,
	log logr.Logger) *standin.StaticPods {
	switch {
	case staticDir == "":
		return nil
	case !pods.Authenticated() && !allowInsecure:
		log.Info("offline rebuilds are off: the node's workers come from an unauthenticated source (a plain-HTTP MetaServer, where "+
			"any process of the node could answer in its place, or a broker session without TLS) that would choose the static pod the "+
			"agent writes; use ssl:// to the broker, the MetaServer's requireAuthorization or --kubeconfig, or accept the risk with "+
			"--allow-insecure-pod-source", "podSource", pods.URL())
		return nil
	}
	bound.Untrusted = !pods.Authenticated()
	if bound.Untrusted {
		log.Info("offline rebuilds from an unauthenticated source (--allow-insecure-pod-source): each stand-in runs as Pod Security's "+
			"restricted profile allows, with node paths only below the directories named", "podSource", pods.URL(), "hostPaths", bound.HostPathRoots)
	}
	return &standin.StaticPods{Dir: staticDir, Workers: workers, Bound: bound}
}

// Actuators restarts through KubeEdge's MetaServer at metaServerURL first (what KubeEdge offers for it; empty:
// none), then through the runtime.
func Actuators(metaServerURL string, runtime *cri.Client) restart.FirstWorking {
	var out restart.FirstWorking
	if metaServerURL != "" {
		out = append(out, &restart.MetaServerActuator{BaseURL: metaServerURL})
	}
	return append(out, &restart.CRIActuator{Runtime: runtime})
}

// ChooseProbe is the probe of the cloud: url when given, its certificate checked against caFile's CA (empty: the
// system's); in a pod of a kubelet node (inCluster), the API server's /readyz, which answers anyone (a watch that
// hangs on a dead link would tell only after TCP gives up); else the one edgecore's configuration implies (empty:
// none). Without one the MetaServer's answers cannot tell whether the node is cut off, which is logged.
func ChooseProbe(url, caFile string, inCluster bool, edgecoreConfig string, log logr.Logger) (*cloudlink.Probe, error) {
	switch {
	case url != "":
		tlsConfig, err := cloudlink.ProbeTLS(url, caFile)
		if err != nil {
			return nil, err
		}
		return &cloudlink.Probe{URL: url, TLS: tlsConfig}, nil
	case inCluster:
		server, tlsConfig, err := desired.InClusterServer()
		if err != nil {
			log.Info("no cloud probe: the API server's address is unknown", "reason", err.Error())
			return nil, nil
		}
		log.Info("probing the API server", "url", server+"/readyz")
		return &cloudlink.Probe{URL: server + "/readyz", TLS: tlsConfig}, nil
	case edgecoreConfig != "":
		probe, why, err := cloudlink.EdgecoreProbe(edgecoreConfig)
		if err != nil {
			log.Info("no cloud probe: the MetaServer's answers cannot tell whether the node is cut off", "reason", err.Error())
			return nil, nil
		}
		log.Info("probing cloudcore from edgecore's configuration", "url", probe.URL, "tls", why)
		return probe, nil
	}
	return nil, nil
}

// APIReachability tells whether the node reaches the API server now: its watch works and, with a probe, the
// cloud answers it [P-HB-1]. With a probe the watcher holds the workers the source stops listing while the cloud
// does not answer: the node lost them, the cloud's deletions cannot arrive then [P-HEAL-3].
func APIReachability(workers *desired.Watcher, probe *cloudlink.Probe) func() bool {
	if probe == nil {
		return workers.Reachable
	}
	workers.Hold = func() bool { return !probe.Reachable() }
	return func() bool { return workers.Reachable() && probe.Reachable() }
}

// APIReachabilityKnown tells whether APIReachability's answer is known yet: the watch and the probe have each
// had an answer since the agent started.
func APIReachabilityKnown(workers *desired.Watcher, probe *cloudlink.Probe) func() bool {
	if probe == nil {
		return workers.Answered
	}
	return func() bool { return workers.Answered() && probe.Probed() }
}
