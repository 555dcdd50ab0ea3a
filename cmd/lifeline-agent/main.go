// Command lifeline-agent runs on every edge node: it learns the node's workers from the API server (or KubeEdge's
// MetaServer) and keeps them on disk, watches them through the container runtime, publishes their states and
// the workers' Sedna reports over MQTT, and journals what it cannot send. It is the one place the agent's parts are
// chosen (sources.go, parts.go) and put together (wiring.go): the pod source, the rebuilder, the restarts and the
// cloud probe, each from its own package under edge/, behind the interfaces of edge/agent's loop.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/kubeedge/api/apis/common/constants"

	"github.com/lifeline-edge/lifeline/cmd/internal/flagcheck"
	"github.com/lifeline-edge/lifeline/cmd/internal/logflags"
	"github.com/lifeline-edge/lifeline/cmd/internal/memlimit"
	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cloudlink"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/reportapi"
	"github.com/lifeline-edge/lifeline/edge/standby"
	"github.com/lifeline-edge/lifeline/edge/standin"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// version and revision are stamped at build time (make images: -ldflags -X main.version=... -X main.revision=...).
var (
	version  = "dev"
	revision = ""
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "gate" {
		os.Exit(runGate(os.Args[2:]))
	}
	o := bindFlags(flag.CommandLine)
	flag.Parse()
	if o.showVersion {
		fmt.Println(versionLine("lifeline-agent"))
		return
	}
	if err := o.validate(flag.CommandLine); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-agent:", err)
		os.Exit(2)
	}
	o.explicit = map[string]bool{}
	flag.Visit(func(f *flag.Flag) { o.explicit[f.Name] = true })
	log, err := o.log.Logger(os.Stderr)
	if err != nil { // checked by validate
		fmt.Fprintln(os.Stderr, "lifeline-agent:", err)
		os.Exit(2)
	}
	log = log.WithValues("node", o.node)
	if soft, why, err := memlimit.Set(os.DirFS("/"), *o.memoryFraction); err != nil {
		log.Error(err, "no soft memory limit")
	} else {
		log.Info("soft memory limit", "bytes", soft, "from", why)
	}
	if o.username == "" {
		o.username = o.node
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
		log.Error(err, "creating the state directory")
		os.Exit(1)
	}
	run := runAgentPod
	if o.standby {
		run = runStandby
	}
	if err := run(ctx, o, log); err != nil {
		log.Error(err, "stopped")
		os.Exit(1)
	}
}

// runAgentPod runs the agent as the node's agent (its DaemonSet pod, or a service of the node) while it holds the
// node, handing it over to the pod of an update; with --standby-manifest it also installs the node's standby, and
// removes it when its DaemonSet is gone.
func runAgentPod(ctx context.Context, o *options, log logr.Logger) error {
	return standby.NodeLock{Dir: o.stateDir}.Serve(ctx, o.poll, log, func(runCtx context.Context) error {
		if o.standbyManifest != "" {
			files := standby.FilesIn(o.stateDir)
			if err := files.Leave(o.caFile); err != nil {
				return err
			}
			if err := standby.Install(o.standbyManifest, o.staticDir); err != nil {
				return err
			}
			log.Info("the node's standby is installed", "staticPodDir", o.staticDir)
			// Only as the pod stops: a hand-over to the next agent pod must not wait for the API server.
			defer func() {
				if ctx.Err() != nil {
					standby.RemoveIfUninstalled(context.Background(), o.daemonSet, o.staticDir, o.stateDir, standby.OwnerGone, log)
				}
			}()
		}
		return runAgent(runCtx, o, log, nil)
	})
}

// runGate is `lifeline-agent gate --path P`, an armed stand-in's gate: it returns once P exists.
func runGate(args []string) int {
	fs := flag.NewFlagSet("lifeline-agent gate", flag.ContinueOnError)
	path := fs.String("path", "", "the file whose creation opens the gate")
	poll := fs.Duration("poll", 100*time.Millisecond, "how often the file is looked for")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *path == "" || *poll <= 0 || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "lifeline-agent gate: --path, a positive --poll and the command to run after -- are required")
		return 2
	}
	standin.WaitForGate(*path, *poll)
	err := standin.ExecWorker(fs.Args())
	fmt.Fprintln(os.Stderr, "lifeline-agent gate:", err)
	return 127 // as a shell says of a command it cannot run
}

// runStandby runs the agent as the node's standby: a static pod that acts only while no agent pod holds the
// node and the API server is out of reach.
func runStandby(ctx context.Context, o *options, log logr.Logger) error {
	probe, err := standby.FilesIn(o.stateDir).Probe(o.cloudProbe, o.cloudProbeCA)
	if err != nil {
		return err
	}
	probe.Period, probe.Timeout = o.probePeriod, o.probeTimeout
	go probe.Run(ctx)
	log.Info("standing by", "probe", probe.URL)
	runner := &standby.Runner{Lock: standby.NodeLock{Dir: o.stateDir}, Interval: o.poll, Log: log,
		CutOff: func() bool { return probe.Probed() && !probe.Reachable() }}
	runner.Run(ctx, func(ctx context.Context) {
		if err := runAgent(ctx, o, log, probe); err != nil {
			log.Error(err, "the standby stopped acting")
		}
	})
	return nil
}

// runAgent runs the agent's loops until ctx ends and they have stopped. standbyProbe is the standby's probe of
// the API server: the standby reads no API server (a static pod has no credentials), only the desired workers
// the agent pod left on the node's disk; nil: the agent pod, reading its pod source.
func runAgent(ctx context.Context, o *options, log logr.Logger, standbyProbe *cloudlink.Probe) error {
	j, err := journal.OpenLimited(filepath.Join(o.stateDir, "journal.db"),
		journal.Limits{Entries: o.maxReports, Bytes: o.maxReportBytes})
	if err != nil {
		return fmt.Errorf("opening the journal: %w", err)
	}
	defer j.Close()
	// The connection is made at the first call: a socket missing or not answering yet is not an error here, but
	// a failing dependency the agent logs, and its readiness names, until the runtime answers.
	runtime, err := cri.Dial(o.socket, 2*time.Second)
	if err != nil {
		return fmt.Errorf("connecting to the container runtime: %w", err)
	}
	defer runtime.Close()
	w := &wiring{o: o, log: log, journal: j, runtime: runtime, runtimeEvents: make(chan struct{}, 1)}
	if err := w.assemble(standbyProbe); err != nil {
		return err
	}
	return w.run(ctx)
}

// serve serves h on l until ctx ends.
func serve(ctx context.Context, l net.Listener, h http.Handler, log logr.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		log.Error(err, "serving", "address", l.Addr())
	}
}

// redacted is a URL without its password, for logs and probes.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return u.Redacted()
}

// options are what the agent's flags say.
type options struct {
	node, cluster, broker, username, passFile, caFile, certFile, keyFile string
	stateDir, socket, apiServer, kubeconfig, cloudProbe, edgecoreConfig  string
	metaServer, staticDir, reportAddr, metrics, healthAddr, hostRoot     string
	forwardTo, standbyManifest, daemonSet, podSource                     string
	inCluster, insecurePods, showVersion, standby, armStandIns           bool
	insecureHostPaths                                                    []string
	cloudProbeCA                                                         string
	explicit                                                             map[string]bool // the flags given
	healGrace, healDeadFor, healWait, poll, heartbeat, retryMax          time.Duration
	dsInterval, dsCountLimit, probePeriod, probeTimeout                  time.Duration
	maxReports, queue, reportConns, reportBurst                          int
	maxReportBytes, dsMaxBytes                                           int64
	reportRate                                                           float64
	memoryFraction                                                       *float64
	log                                                                  logflags.Options
}

// bindFlags defines the agent's flags on fs; their values land in the options it returns once fs is parsed.
func bindFlags(fs *flag.FlagSet) *options {
	o := &options{}
	bindBrokerFlags(fs, o)
	bindPodSourceFlags(fs, o)
	bindHealFlags(fs, o)
	bindReportFlags(fs, o)
	bindStandbyFlags(fs, o)
	o.memoryFraction = memlimit.FractionFlag(fs)
	logflags.Bind(fs, &o.log)
	fs.Func("v", "deprecated: --log-level with a verbosity", func(v string) error { o.log.Level = v; return nil })
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	return o
}

// bindBrokerFlags binds who the node is and how it reaches the broker.
func bindBrokerFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.node, "node-name", os.Getenv("NODE_NAME"), "this node's name")
	fs.StringVar(&o.cluster, "cluster", "default", "cluster name in the topic tree")
	fs.StringVar(&o.broker, "broker", "tcp://127.0.0.1:1883", "MQTT broker URL (tcp:// or ssl://)")
	fs.StringVar(&o.username, "username", os.Getenv("LIFELINE_MQTT_USERNAME"), "MQTT username (default: $LIFELINE_MQTT_USERNAME, else the node's name)")
	fs.StringVar(&o.passFile, "password-file", "", "file holding the MQTT password (default: $LIFELINE_MQTT_PASSWORD)")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM certificates that sign the broker's, for ssl:// (default: the system's); not KubeEdge's CA")
	fs.StringVar(&o.certFile, "cert-file", constants.DefaultCertFile,
		"client certificate for ssl:// (PEM): the node's, which KubeEdge issued and rotates; read again at each connection; empty: none")
	fs.StringVar(&o.keyFile, "key-file", constants.DefaultKeyFile, "the client certificate's key (PEM)")
}

// bindPodSourceFlags binds where the node's workers are read and rebuilt, and how a cut is told.
func bindPodSourceFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/lifeline-agent", "directory of the journal and the birth sequence")
	fs.StringVar(&o.socket, "cri-socket", cri.DefaultSocket, "container runtime CRI socket")
	fs.StringVar(&o.apiServer, "api-server", "http://"+constants.DefaultMetaServerAddr,
		"where the node's pods are listed and watched: KubeEdge's MetaServer on the node by default")
	fs.StringVar(&o.podSource, "pod-source", PodSourceAuto, "where the node's workers and their stand-ins come from: "+
		"controller (the controller's word over the broker session; trusted for offline rebuilds over ssl:// only), "+
		"api (--in-cluster, --kubeconfig, --api-server), or auto: controller on a KubeEdge node unless --api-server, --metaserver, "+
		"--kubeconfig or --in-cluster is given, api otherwise")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server; overrides --api-server")
	fs.BoolVar(&o.inCluster, "in-cluster", false,
		"read the node's pods from the API server with the pod's service account (a node whose pods Kubernetes' kubelet runs); "+
			"overrides --kubeconfig and --api-server")
	fs.StringVar(&o.cloudProbe, "cloud-probe", "", "URL in the cloud (the API server's /healthz, or cloudcore's HTTPS server) whose answer says "+
		"the node is connected; needed with the MetaServer, which answers from the node's store even while the node is cut off "+
		"(default: cloudcore's /ca.crt at the modules.edgeHub.httpServer of --edgecore-config); HTTPS only")
	fs.StringVar(&o.cloudProbeCA, "cloud-probe-ca", "", "the CA that --cloud-probe's certificate is checked against; empty: the system's")
	fs.DurationVar(&o.probePeriod, "cloud-probe-period", cloudlink.DefaultProbePeriod,
		"how often the cloud probe asks; a cut is told at most this plus --cloud-probe-timeout after it begins. Over HTTP/2 each "+
			"attempt after the first is a PING frame on one kept connection, about 100 bytes both ways")
	fs.DurationVar(&o.probeTimeout, "cloud-probe-timeout", cloudlink.DefaultProbeTimeout,
		"an attempt of the cloud probe not answered within this says the node is cut off; keep it above the link's worst round trip")
	fs.StringVar(&o.edgecoreConfig, "edgecore-config", constants.EdgecoreConfigPath,
		"edgecore's configuration, read for the default --cloud-probe; empty: no default probe")
	fs.StringVar(&o.metaServer, "metaserver", "http://"+constants.DefaultMetaServerAddr,
		"KubeEdge's MetaServer on the node, which restarts pods without the API server; empty: restart through the runtime only")
	fs.StringVar(&o.staticDir, "static-pod-dir", "/etc/kubeedge/manifests",
		"edged's static-pod directory, where a worker whose pod the node lost is rebuilt while cut off; empty: never rebuild")
	fs.BoolVar(&o.insecurePods, "allow-insecure-pod-source", false,
		"rebuild workers offline from pods read over plain HTTP; without it a pod source that is not HTTPS with a checked "+
			"certificate is read, but never trusted to say what the agent writes into the static-pod directory")
	fs.Func("insecure-pod-source-host-paths", "with --allow-insecure-pod-source, a comma-separated list of node directories below "+
		"which a rebuilt worker may mount node paths (its Models' and Datasets' directories); none: no node path", func(v string) error {
		for _, dir := range strings.Split(v, ",") {
			if dir = strings.TrimSpace(dir); dir == "" {
				continue
			}
			if !path.IsAbs(dir) || path.Clean(dir) == "/" {
				return fmt.Errorf("%q is not a directory below /", dir)
			}
			o.insecureHostPaths = append(o.insecureHostPaths, path.Clean(dir))
		}
		return nil
	})
}

// bindHealFlags binds the agent's timing: healing, polling, heartbeats and the broker's back-off.
func bindHealFlags(fs *flag.FlagSet, o *options) {
	fs.DurationVar(&o.healGrace, "heal-api-grace", core.DefaultHealTiming.APIGrace,
		"the API server must be out of reach this long before the agent restarts dead workers itself")
	fs.DurationVar(&o.healDeadFor, "heal-dead-for", core.DefaultHealTiming.DeadFor, "a worker must stay dead this long before a local restart")
	fs.DurationVar(&o.healWait, "heal-controller-wait", core.DefaultHealTiming.ControllerWait,
		"while the broker is reachable, how long a dead worker waits for the controller's command before a local restart")
	fs.DurationVar(&o.poll, "poll-interval", 500*time.Millisecond, "how often the runtime is read")
	fs.DurationVar(&o.heartbeat, "heartbeat-interval", lifelinev1.DefaultHeartbeatInterval,
		"heartbeat period, said in every birth; the controller takes the node as silent after three of them")
	fs.DurationVar(&o.retryMax, "broker-retry-max", 15*time.Second,
		"longest wait between two attempts to reach the broker; the wait starts at 1 s and doubles with each failure")
}

// bindReportFlags binds the endpoints the agent serves on the node, and the bounds of the reports it takes.
func bindReportFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.reportAddr, "report-address", "127.0.0.1:9100", "address of the Sedna worker report API (LC_SERVER)")
	fs.StringVar(&o.metrics, "metrics-address", "127.0.0.1:9101", "address of /metrics; empty disables it")
	fs.StringVar(&o.healthAddr, "health-address", "127.0.0.1:9102",
		"address of /healthz (the agent's loops turn) and /readyz (the runtime answers, the broker and the API server or MetaServer "+
			"were reached since start); empty disables them")
	fs.IntVar(&o.maxReports, "max-journaled-reports", 10000, "reports kept while the broker is unreachable; older ones are dropped and counted")
	fs.Int64Var(&o.maxReportBytes, "max-journaled-report-bytes", journal.DefaultMaxLogBytes,
		"bytes of reports kept while the broker is unreachable; older ones are dropped and counted")
	fs.IntVar(&o.queue, "report-queue", 64, "reports accepted but not yet journaled (each up to 64 KiB); beyond it reports are refused with 503")
	fs.StringVar(&o.hostRoot, "host-root", "", "where the node's root is mounted in the agent's container, to read Datasets' index files; empty: the node's paths as they are")
	fs.DurationVar(&o.dsInterval, "dataset-count-interval", reportapi.DatasetInterval, "how often the trainers' Dataset index files are counted (Sedna's LC: 60 s)")
	fs.StringVar(&o.forwardTo, "forward-unowned-reports-to", "",
		"base URL of Sedna's local controller (e.g. http://127.0.0.1:9100): reports of workers not the node's are posted there instead of refused")
	fs.IntVar(&o.reportConns, "report-max-connections", reportapi.DefaultMaxConnections,
		"connections the report API serves at once; further ones wait in the kernel's backlog")
	fs.Float64Var(&o.reportRate, "report-rate", reportapi.DefaultReportRate,
		"reports a second each worker gets into the journal; beyond it (and the burst) reports are refused with 429; 0: no limit")
	fs.IntVar(&o.reportBurst, "report-burst", reportapi.DefaultReportBurst, "reports a worker may post at once above --report-rate")
	fs.Int64Var(&o.dsMaxBytes, "dataset-index-max-bytes", reportapi.DefaultMaxIndexBytes, "a Dataset index file larger than this is not counted")
	fs.DurationVar(&o.dsCountLimit, "dataset-count-timeout", reportapi.DefaultCountTimeout,
		"a Dataset index file not read within this is not counted, nor read again until that read ends")
}

// bindStandbyFlags binds the standby's and the stand-ins' flags.
func bindStandbyFlags(fs *flag.FlagSet, o *options) {
	fs.BoolVar(&o.standby, "standby", false,
		"run as the node's standby (a static pod of a kubelet node): act only while the API server is out of reach and no agent pod "+
			"runs on the node, from the desired workers on the node's disk; give way as soon as an agent pod starts")
	fs.StringVar(&o.standbyManifest, "standby-manifest", "",
		"the standby's static-pod manifest, which the agent pod installs in --static-pod-dir with the files the standby needs; empty: none")
	fs.BoolVar(&o.armStandIns, "arm-stand-ins", false,
		"arm each worker's stand-in ahead, its containers held by a gate (this binary, copied into --state-dir), while the node reaches the API server, "+
			"so that a rebuild needs nothing from the cloud; false: a rebuild writes the stand-in then, and armed ones are removed")
	fs.StringVar(&o.daemonSet, "daemonset", "", "NAMESPACE/NAME of the agent's DaemonSet: once it is gone, the agent pod removes the standby as it stops")
}

// flagRules are the agent's flags that must be positive beside its durations (all of which must be), and those
// where zero means something.
var flagRules = flagcheck.Rules{
	Counts: []string{"max-journaled-reports", "max-journaled-report-bytes", "report-queue", "report-max-connections",
		"report-burst", "dataset-index-max-bytes"},
	// --report-rate=0: no limit; --memory-limit-fraction=0: no soft limit.
	ZeroOK: []string{"report-rate", "memory-limit-fraction"},
}

// validate refuses, before anything starts, what the parsed flags of fs could only fail with later.
func (o *options) validate(fs *flag.FlagSet) error {
	errs := []error{flagcheck.Check(fs, flagRules), o.log.Check()}
	if o.node == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	if o.heartbeat > 0 {
		if err := lifelinev1.CheckHeartbeatInterval(o.heartbeat); err != nil {
			errs = append(errs, fmt.Errorf("--heartbeat-interval: %w", err))
		}
	}
	errs = append(errs, flagcheck.BrokerURL("broker", o.broker))
	if o.podSource != PodSourceAuto && o.podSource != PodSourceController && o.podSource != PodSourceAPI {
		errs = append(errs, fmt.Errorf("--pod-source %q: want auto, controller or api", o.podSource))
	}
	if _, err := cloudlink.ParseProbeURL(o.cloudProbe); o.cloudProbe != "" && err != nil {
		errs = append(errs, fmt.Errorf("--cloud-probe: %w", err))
	} else if o.cloudProbe != "" && !strings.HasPrefix(o.cloudProbe, "https://") {
		errs = append(errs, fmt.Errorf("--cloud-probe %q: not HTTPS, so anyone on the path could answer it", o.cloudProbe))
	}
	if o.forwardTo != "" {
		if u, err := url.Parse(o.forwardTo); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--forward-unowned-reports-to %q is not an http(s) URL", o.forwardTo))
		}
	}
	if o.standby && o.standbyManifest != "" {
		errs = append(errs, errors.New("--standby and --standby-manifest: the standby installs no standby"))
	}
	if o.standbyManifest != "" && (!o.inCluster || o.staticDir == "") {
		errs = append(errs, errors.New("--standby-manifest needs --in-cluster and --static-pod-dir: the standby is for kubelet nodes"))
	}
	if o.standby && o.staticDir == "" {
		errs = append(errs, errors.New("--standby needs --static-pod-dir: rebuilding the workers is what it is for"))
	}
	if ns, name, ok := strings.Cut(o.daemonSet, "/"); o.daemonSet != "" && (!ok || ns == "" || name == "") {
		errs = append(errs, fmt.Errorf("--daemonset %q is not NAMESPACE/NAME", o.daemonSet))
	}
	if *o.memoryFraction > 1 {
		errs = append(errs, fmt.Errorf("--memory-limit-fraction must be at most 1, got %v", *o.memoryFraction))
	}
	return errors.Join(errs...)
}

// versionLine is what --version prints: the command, its version and, when stamped, its commit.
func versionLine(command string) string {
	if revision == "" {
		return command + " " + version
	}
	return command + " " + version + " (revision " + revision + ")"
}
