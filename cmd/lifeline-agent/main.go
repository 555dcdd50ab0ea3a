// Command lifeline-agent runs on every edge node: it learns the node's workers from the API server (or KubeEdge's
// MetaServer) and keeps them on disk, watches them through the container runtime, publishes their states and
// the workers' Sedna reports over MQTT, and journals what it cannot send.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/kubeedge/api/apis/common/constants"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lifeline-edge/lifeline/cmd/internal/flagcheck"
	"github.com/lifeline-edge/lifeline/cmd/internal/memlimit"
	"github.com/lifeline-edge/lifeline/edge/agent"
	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/certfile"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/edge/reportapi"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// version and revision are stamped at build time (make images: -ldflags -X main.version=... -X main.revision=...).
var (
	version  = "dev"
	revision = ""
)

func main() {
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
	explicit := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	// The standard library's JSON logger: the agent stays small, without the controller's logging stack.
	log := logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-o.verbosity)})).
		WithValues("node", o.node)
	if soft, why, err := memlimit.Set(os.DirFS("/"), *o.memoryFraction); err != nil {
		log.Error(err, "no soft memory limit")
	} else {
		log.Info("soft memory limit", "bytes", soft, "from", why)
	}
	if o.username == "" {
		o.username = o.node
	}
	password := os.Getenv("LIFELINE_MQTT_PASSWORD")
	if o.passFile != "" {
		data, err := os.ReadFile(o.passFile)
		if err != nil {
			log.Error(err, "reading the MQTT password")
			os.Exit(1)
		}
		password = strings.TrimSpace(string(data))
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12} // for ssl:// only
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			log.Error(err, "reading the broker's CA certificates", "file", o.caFile)
			os.Exit(1)
		}
		tlsConfig.RootCAs = pool
	}
	if o.certFile != "" && o.keyFile != "" {
		// Presented at every connection as the files are then: edgecore rotates them in place.
		pair := &certfile.Pair{CertFile: o.certFile, KeyFile: o.keyFile}
		if err := pair.Load(); err != nil {
			log.Error(err, "loading the client certificate", "certFile", o.certFile, "keyFile", o.keyFile)
			os.Exit(1)
		}
		tlsConfig.GetClientCertificate = pair.GetClientCertificate
		if c := pair.Current(); c != nil {
			log.Info("client certificate", "subject", c.Leaf.Subject.String(), "serial", c.Leaf.SerialNumber.Text(16), "notAfter", c.Leaf.NotAfter)
		} else {
			log.Info("no client certificate yet: logging in by password until one appears", "certFile", o.certFile)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
		log.Error(err, "creating the state directory")
		os.Exit(1)
	}
	j, err := journal.OpenLimited(filepath.Join(o.stateDir, "journal.db"),
		journal.Limits{Entries: o.maxReports, Bytes: o.maxReportBytes})
	if err != nil {
		log.Error(err, "opening the journal")
		os.Exit(1)
	}
	defer j.Close()
	// The connection is made at the first call: a socket missing or not answering yet is not an error here, but
	// a failing dependency the agent logs, and its readiness names, until the runtime answers.
	runtime, err := cri.Dial(o.socket, 2*time.Second)
	if err != nil {
		log.Error(err, "connecting to the container runtime")
		os.Exit(1)
	}
	defer runtime.Close()

	source, err := agent.ChoosePods(o.inCluster, o.kubeconfig, o.apiServer, explicit["api-server"], o.edgecoreConfig, o.metaServer,
		explicit["metaserver"], log.WithName("pods"))
	if err != nil {
		log.Error(err, "configuring where the node's pods are read")
		os.Exit(1)
	}
	// The watcher and the publisher log their retries at -v=2: the taps keep their latest error for the
	// first-failure lines and the readiness probe.
	var podsErrors, brokerErrors agent.ErrorTap
	workers, err := desired.New(source.Pods, o.node, o.stateDir, podsErrors.Logger(log.WithName("desired")))
	if err != nil {
		log.Error(err, "loading the desired workers")
		os.Exit(1)
	}

	rebuilder := agent.ChooseRebuilder(source.Pods, o.staticDir, o.insecurePods, workers,
		[]string{o.stateDir, filepath.Dir(o.socket), filepath.Dir(o.edgecoreConfig)}, log)
	probe := agent.ChooseProbe(o.cloudProbe, o.inCluster, o.edgecoreConfig, log.WithName("probe"))
	if probe != nil {
		go probe.Run(ctx, o.heartbeat)
	}
	apiReachable, apiKnown := agent.APIReachability(workers, probe), agent.APIReachabilityKnown(workers, probe)
	var edgeAgent *agent.Agent
	pub := publisher.New(publisher.Config{Broker: o.broker, Username: o.username, Password: password, TLS: tlsConfig,
		Cluster: o.cluster, Node: o.node, AgentVersion: version, MaxRetryInterval: o.retryMax, HeartbeatInterval: o.heartbeat,
		APIReachable: func() (bool, bool) { return apiReachable(), apiKnown() }, BootID: bootID(), StateDir: o.stateDir,
		Log: brokerErrors.Logger(log.WithName("publisher")), OnCommand: func(payload []byte) { edgeAgent.HandleCommand(payload) }}, j)
	health := &agent.Health{RuntimeAddress: o.socket, RuntimeFresh: agent.RuntimeFreshness(o.poll),
		Broker: agent.Session{Address: redacted(o.broker), Up: pub.Connected, Err: brokerErrors.Err},
		// The pod source answers (its watch, or a refusal), whether or not the cloud probe reaches the cloud: a
		// MetaServer answering a cut-off node is the edge working as it should.
		Pods: agent.Session{Address: source.Pods.URL(), Up: workers.Reachable, Err: podsErrors.Err}}
	health.Loop(agent.LoopAgent, o.poll)
	health.Loop(agent.LoopHeartbeats, o.heartbeat)
	timing := core.DefaultHealTiming
	timing.APIGrace, timing.DeadFor, timing.ControllerWait = o.healGrace, o.healDeadFor, o.healWait
	reg := prometheus.NewRegistry()
	agent.RegisterMetrics(reg, agent.StateSources{BrokerUp: pub.Connected, APIReachable: apiReachable, Journal: j})
	reports := reportapi.New(o.cluster, o.node, pub, workers, pub.BirthSeq, o.queue, reg, log.WithName("reports"))
	reports.Counter = j
	reports.MaxConnections, reports.ReportRate, reports.ReportBurst = o.reportConns, o.reportRate, o.reportBurst
	if o.forwardTo != "" {
		reports.ForwardUnowned(o.forwardTo, o.queue)
	}
	events := make(chan struct{}, 1)
	edgeAgent, err = agent.New(agent.Config{Cluster: o.cluster, Node: o.node, Source: runtime, Workers: workers, Publisher: pub, Store: j,
		Actuator: agent.Actuators(source.ActuatorURL, runtime), Rebuilder: rebuilder, APIReachable: apiReachable, BrokerUp: pub.Connected,
		Timing: timing, Interval: o.poll, Changed: events, Log: log.WithName("agent"), Probe: health.AgentLoop()})
	if err != nil {
		log.Error(err, "starting the agent")
		os.Exit(1)
	}
	var probes net.Listener
	if o.healthAddr != "" {
		// Bound before anything runs: a probe port another process holds would answer the kubelet in the agent's
		// place.
		if probes, err = net.Listen("tcp", o.healthAddr); err != nil {
			log.Error(err, "serving the probes (--health-address)")
			os.Exit(1)
		}
	}

	published := make(chan struct{})
	go func() { pub.Run(ctx); close(published) }()
	go reports.Run(ctx)
	datasets := &reportapi.DatasetCounter{Cluster: o.cluster, Node: o.node, Sink: pub, Workers: workers.Workers, BirthSeq: pub.BirthSeq,
		Counter: j, HostRoot: o.hostRoot, StateDir: o.stateDir, MaxIndexBytes: o.dsMaxBytes, CountTimeout: o.dsCountLimit,
		Log: log.WithName("datasets")}
	go datasets.Run(ctx, o.dsInterval)
	go workers.Run(ctx, time.Second)
	go edgeAgent.Run(ctx)
	go agent.FollowContainerEvents(ctx, runtime, events, log.WithName("events"))
	go agent.Heartbeats(ctx, o.cluster, o.node, o.heartbeat, health.Heartbeats(pub), apiReachable)
	go health.Run(ctx, log.WithName("health"))
	if probes != nil {
		go serve(ctx, probes, health.Handler(), log.WithName("health"))
	}
	if o.metrics != "" {
		go func() {
			srv := &http.Server{Addr: o.metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
			go func() { <-ctx.Done(); _ = srv.Close() }()
			if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
				log.Error(err, "serving metrics")
			}
		}()
	}
	log.Info("started", "version", version, "revision", revision, "broker", redacted(o.broker), "reportAddress", o.reportAddr,
		"criSocket", o.socket, "podSource", source.Pods.URL(), "healthAddress", o.healthAddr)
	if err := reports.ListenAndServe(ctx, o.reportAddr); err != nil {
		log.Error(err, "report API")
		os.Exit(1)
	}
	<-ctx.Done()
	// The publisher ends with its own death message [P-DEATH-1].
	select {
	case <-published:
	case <-time.After(5 * time.Second):
	}
}

// serve serves h on l until ctx ends.
func serve(ctx context.Context, l net.Listener, h http.Handler, log logr.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		log.Error(err, "serving the probes")
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
	forwardTo                                                            string
	inCluster, insecurePods, showVersion                                 bool
	healGrace, healDeadFor, healWait, poll, heartbeat, retryMax          time.Duration
	dsInterval, dsCountLimit                                             time.Duration
	maxReports, queue, reportConns, reportBurst, verbosity               int
	maxReportBytes, dsMaxBytes                                           int64
	reportRate                                                           float64
	memoryFraction                                                       *float64
}

// bindFlags defines the agent's flags on fs; their values land in the options it returns once fs is parsed.
func bindFlags(fs *flag.FlagSet) *options {
	o := &options{}
	fs.StringVar(&o.node, "node-name", os.Getenv("NODE_NAME"), "this node's name")
	fs.StringVar(&o.cluster, "cluster", "default", "cluster name in the topic tree")
	fs.StringVar(&o.broker, "broker", "tcp://127.0.0.1:1883", "MQTT broker URL (tcp:// or ssl://)")
	fs.StringVar(&o.username, "username", os.Getenv("LIFELINE_MQTT_USERNAME"), "MQTT username (default: $LIFELINE_MQTT_USERNAME, else the node's name)")
	fs.StringVar(&o.passFile, "password-file", "", "file holding the MQTT password (default: $LIFELINE_MQTT_PASSWORD)")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM certificates that sign the broker's, for ssl:// (default: the system's); not KubeEdge's CA")
	fs.StringVar(&o.certFile, "cert-file", constants.DefaultCertFile,
		"client certificate for ssl:// (PEM): the node's, which KubeEdge issued and rotates; read again at each connection; empty: none")
	fs.StringVar(&o.keyFile, "key-file", constants.DefaultKeyFile, "the client certificate's key (PEM)")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/lifeline-agent", "directory of the journal and the birth sequence")
	fs.StringVar(&o.socket, "cri-socket", cri.DefaultSocket, "container runtime CRI socket")
	fs.StringVar(&o.apiServer, "api-server", "http://"+constants.DefaultMetaServerAddr,
		"where the node's pods are listed and watched: KubeEdge's MetaServer on the node by default")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server; overrides --api-server")
	fs.BoolVar(&o.inCluster, "in-cluster", false,
		"read the node's pods from the API server with the pod's service account (a node whose pods Kubernetes' kubelet runs); "+
			"overrides --kubeconfig and --api-server")
	fs.StringVar(&o.cloudProbe, "cloud-probe", "", "URL in the cloud (the API server's /healthz, or cloudcore's HTTPS server) whose answer says "+
		"the node is connected; needed with the MetaServer, which answers from the node's store even while the node is cut off "+
		"(default: cloudcore's /ca.crt at the modules.edgeHub.httpServer of --edgecore-config)")
	fs.StringVar(&o.edgecoreConfig, "edgecore-config", constants.EdgecoreConfigPath,
		"edgecore's configuration, read for the default --cloud-probe; empty: no default probe")
	fs.StringVar(&o.metaServer, "metaserver", "http://"+constants.DefaultMetaServerAddr,
		"KubeEdge's MetaServer on the node, which restarts pods without the API server; empty: restart through the runtime only")
	fs.StringVar(&o.staticDir, "static-pod-dir", "/etc/kubeedge/manifests",
		"edged's static-pod directory, where a worker whose pod the node lost is rebuilt while cut off; empty: never rebuild")
	fs.BoolVar(&o.insecurePods, "allow-insecure-pod-source", false,
		"rebuild workers offline from pods read over plain HTTP; without it a pod source that is not HTTPS with a checked "+
			"certificate is read, but never trusted to say what the agent writes into the static-pod directory")
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
	o.memoryFraction = memlimit.FractionFlag(fs)
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity: 2 logs actions, 4 details")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	return o
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
	errs := []error{flagcheck.Check(fs, flagRules)}
	if o.node == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	if o.heartbeat > 0 {
		if err := lifelinev1.CheckHeartbeatInterval(o.heartbeat); err != nil {
			errs = append(errs, fmt.Errorf("--heartbeat-interval: %w", err))
		}
	}
	errs = append(errs, flagcheck.BrokerURL("broker", o.broker))
	if o.forwardTo != "" {
		if u, err := url.Parse(o.forwardTo); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--forward-unowned-reports-to %q is not an http(s) URL", o.forwardTo))
		}
	}
	if *o.memoryFraction > 1 {
		errs = append(errs, fmt.Errorf("--memory-limit-fraction must be at most 1, got %v", *o.memoryFraction))
	}
	return errors.Join(errs...)
}

// bootID identifies this boot of the node, so the controller can tell a node reboot from an agent restart.
func bootID() string {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}

// versionLine is what --version prints: the command, its version and, when stamped, its commit.
func versionLine(command string) string {
	if revision == "" {
		return command + " " + version
	}
	return command + " " + version + " (revision " + revision + ")"
}
