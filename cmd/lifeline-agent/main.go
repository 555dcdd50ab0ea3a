// Command lifeline-agent runs on every edge node: it learns the node's workers from the API server (or KubeEdge's
// MetaServer) and keeps them on disk, watches them through the container runtime, publishes their states and
// the workers' Sedna reports over MQTT, and journals what it cannot send.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
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
	var (
		node     = flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name")
		cluster  = flag.String("cluster", "default", "cluster name in the topic tree")
		broker   = flag.String("broker", "tcp://127.0.0.1:1883", "MQTT broker URL (tcp:// or ssl://)")
		username = flag.String("username", os.Getenv("LIFELINE_MQTT_USERNAME"), "MQTT username (default: $LIFELINE_MQTT_USERNAME, else the node's name)")
		passFile = flag.String("password-file", "", "file holding the MQTT password (default: $LIFELINE_MQTT_PASSWORD)")
		caFile   = flag.String("ca-file", "", "PEM certificates that sign the broker's, for ssl:// (default: the system's); not KubeEdge's CA")
		certFile = flag.String("cert-file", constants.DefaultCertFile,
			"client certificate for ssl:// (PEM): the node's, which KubeEdge issued and rotates; read again at each connection; empty: none")
		keyFile   = flag.String("key-file", constants.DefaultKeyFile, "the client certificate's key (PEM)")
		stateDir  = flag.String("state-dir", "/var/lib/lifeline-agent", "directory of the journal and the birth sequence")
		socket    = flag.String("cri-socket", cri.DefaultSocket, "container runtime CRI socket")
		apiServer = flag.String("api-server", "http://"+constants.DefaultMetaServerAddr,
			"where the node's pods are listed and watched: KubeEdge's MetaServer on the node by default")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the API server; overrides --api-server")
		cloudProbe = flag.String("cloud-probe", "", "URL in the cloud (the API server's /healthz, or cloudcore's HTTPS server) whose answer says "+
			"the node is connected; needed with the MetaServer, which answers from the node's store even while the node is cut off "+
			"(default: cloudcore's /ca.crt at the modules.edgeHub.httpServer of --edgecore-config)")
		edgecoreConfig = flag.String("edgecore-config", constants.EdgecoreConfigPath,
			"edgecore's configuration, read for the default --cloud-probe; empty: no default probe")
		metaServer = flag.String("metaserver", "http://"+constants.DefaultMetaServerAddr,
			"KubeEdge's MetaServer on the node, which restarts pods without the API server; empty: restart through the runtime only")
		staticDir = flag.String("static-pod-dir", "/etc/kubeedge/manifests",
			"edged's static-pod directory, where a worker whose pod the node lost is rebuilt while cut off; empty: never rebuild")
		insecurePods = flag.Bool("allow-insecure-pod-source", false,
			"rebuild workers offline from pods read over plain HTTP; without it a pod source that is not HTTPS with a checked "+
				"certificate is read, but never trusted to say what the agent writes into the static-pod directory")
		healGrace = flag.Duration("heal-api-grace", core.DefaultHealTiming.APIGrace,
			"the API server must be out of reach this long before the agent restarts dead workers itself")
		healDeadFor = flag.Duration("heal-dead-for", core.DefaultHealTiming.DeadFor, "a worker must stay dead this long before a local restart")
		healWait    = flag.Duration("heal-controller-wait", core.DefaultHealTiming.ControllerWait,
			"while the broker is reachable, how long a dead worker waits for the controller's command before a local restart")
		poll      = flag.Duration("poll-interval", 500*time.Millisecond, "how often the runtime is read")
		heartbeat = flag.Duration("heartbeat-interval", lifelinev1.DefaultHeartbeatInterval,
			"heartbeat period, said in every birth; the controller takes the node as silent after three of them")
		retryMax = flag.Duration("broker-retry-max", 15*time.Second,
			"longest wait between two attempts to reach the broker; the wait starts at 1 s and doubles with each failure")
		reportAddr     = flag.String("report-address", "127.0.0.1:9100", "address of the Sedna worker report API (LC_SERVER)")
		metrics        = flag.String("metrics-address", "127.0.0.1:9101", "address of /metrics; empty disables it")
		maxReports     = flag.Int("max-journaled-reports", 10000, "reports kept while the broker is unreachable; older ones are dropped and counted")
		maxReportBytes = flag.Int64("max-journaled-report-bytes", journal.DefaultMaxLogBytes,
			"bytes of reports kept while the broker is unreachable; older ones are dropped and counted")
		queue      = flag.Int("report-queue", 64, "reports accepted but not yet journaled (each up to 64 KiB); beyond it reports are refused with 503")
		hostRoot   = flag.String("host-root", "", "where the node's root is mounted in the agent's container, to read Datasets' index files; empty: the node's paths as they are")
		dsInterval = flag.Duration("dataset-count-interval", reportapi.DatasetInterval, "how often the trainers' Dataset index files are counted (Sedna's LC: 60 s)")
		forwardTo  = flag.String("forward-unowned-reports-to", "",
			"base URL of Sedna's local controller (e.g. http://127.0.0.1:9100): reports of workers not the node's are posted there instead of refused")
		reportConns = flag.Int("report-max-connections", reportapi.DefaultMaxConnections,
			"connections the report API serves at once; further ones wait in the kernel's backlog")
		reportRate = flag.Float64("report-rate", reportapi.DefaultReportRate,
			"reports a second each worker gets into the journal; beyond it (and the burst) reports are refused with 429; 0: no limit")
		reportBurst  = flag.Int("report-burst", reportapi.DefaultReportBurst, "reports a worker may post at once above --report-rate")
		dsMaxBytes   = flag.Int64("dataset-index-max-bytes", reportapi.DefaultMaxIndexBytes, "a Dataset index file larger than this is not counted")
		dsCountLimit = flag.Duration("dataset-count-timeout", reportapi.DefaultCountTimeout,
			"a Dataset index file not read within this is not counted, nor read again until that read ends")
	)
	memoryFraction := memlimit.FractionFlag(flag.CommandLine)
	verbosity := flag.Int("v", 0, "log verbosity: 2 logs actions, 4 details")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(versionLine("lifeline-agent"))
		return
	}
	explicit := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if u, err := url.Parse(*forwardTo); *forwardTo != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		fmt.Fprintf(os.Stderr, "lifeline-agent: --forward-unowned-reports-to %q is not an http(s) URL\n", *forwardTo)
		os.Exit(2)
	}
	// The standard library's JSON logger: the agent stays small, without the controller's logging stack.
	log := logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-*verbosity)})).
		WithValues("node", *node)
	if err := lifelinev1.CheckHeartbeatInterval(*heartbeat); err != nil {
		fmt.Fprintf(os.Stderr, "lifeline-agent: --heartbeat-interval: %v\n", err)
		os.Exit(2)
	}
	if *node == "" {
		fmt.Fprintln(os.Stderr, "lifeline-agent: --node-name (or $NODE_NAME) is required")
		os.Exit(2)
	}
	if soft, why, err := memlimit.Set(os.DirFS("/"), *memoryFraction); err != nil {
		log.Error(err, "no soft memory limit")
	} else {
		log.Info("soft memory limit", "bytes", soft, "from", why)
	}
	if *username == "" {
		*username = *node
	}
	password := os.Getenv("LIFELINE_MQTT_PASSWORD")
	if *passFile != "" {
		data, err := os.ReadFile(*passFile)
		if err != nil {
			log.Error(err, "reading the MQTT password")
			os.Exit(1)
		}
		password = strings.TrimSpace(string(data))
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12} // for ssl:// only
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			log.Error(err, "reading the broker's CA certificates", "file", *caFile)
			os.Exit(1)
		}
		tlsConfig.RootCAs = pool
	}
	if *certFile != "" && *keyFile != "" {
		// Presented at every connection as the files are then: edgecore rotates them in place.
		pair := &certfile.Pair{CertFile: *certFile, KeyFile: *keyFile}
		if err := pair.Load(); err != nil {
			log.Error(err, "loading the client certificate", "certFile", *certFile, "keyFile", *keyFile)
			os.Exit(1)
		}
		tlsConfig.GetClientCertificate = pair.GetClientCertificate
		if c := pair.Current(); c != nil {
			log.Info("client certificate", "subject", c.Leaf.Subject.String(), "serial", c.Leaf.SerialNumber.Text(16), "notAfter", c.Leaf.NotAfter)
		} else {
			log.Info("no client certificate yet: logging in by password until one appears", "certFile", *certFile)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := os.MkdirAll(*stateDir, 0o700); err != nil {
		log.Error(err, "creating the state directory")
		os.Exit(1)
	}
	j, err := journal.OpenLimited(filepath.Join(*stateDir, "journal.db"),
		journal.Limits{Entries: *maxReports, Bytes: *maxReportBytes})
	if err != nil {
		log.Error(err, "opening the journal")
		os.Exit(1)
	}
	defer j.Close()
	runtime, err := cri.Dial(*socket, 2*time.Second)
	if err != nil {
		log.Error(err, "connecting to the container runtime")
		os.Exit(1)
	}
	defer runtime.Close()

	source, err := agent.ChoosePods(*kubeconfig, *apiServer, explicit["api-server"], *edgecoreConfig, *metaServer, explicit["metaserver"],
		log.WithName("pods"))
	if err != nil {
		log.Error(err, "configuring where the node's pods are read")
		os.Exit(1)
	}
	workers, err := desired.New(source.Pods, *node, *stateDir, log.WithName("desired"))
	if err != nil {
		log.Error(err, "loading the desired workers")
		os.Exit(1)
	}

	rebuilder := agent.ChooseRebuilder(source.Pods, *staticDir, *insecurePods, workers,
		[]string{*stateDir, filepath.Dir(*socket), filepath.Dir(*edgecoreConfig)}, log)
	probe := agent.ChooseProbe(*cloudProbe, *edgecoreConfig, log.WithName("probe"))
	if probe != nil {
		go probe.Run(ctx, *heartbeat)
	}
	apiReachable, apiKnown := agent.APIReachability(workers, probe), agent.APIReachabilityKnown(workers, probe)
	var edgeAgent *agent.Agent
	pub := publisher.New(publisher.Config{Broker: *broker, Username: *username, Password: password, TLS: tlsConfig,
		Cluster: *cluster, Node: *node, AgentVersion: version, MaxRetryInterval: *retryMax, HeartbeatInterval: *heartbeat,
		APIReachable: func() (bool, bool) { return apiReachable(), apiKnown() }, BootID: bootID(), StateDir: *stateDir,
		Log: log.WithName("publisher"), OnCommand: func(payload []byte) { edgeAgent.HandleCommand(payload) }}, j)
	timing := core.DefaultHealTiming
	timing.APIGrace, timing.DeadFor, timing.ControllerWait = *healGrace, *healDeadFor, *healWait
	reg := prometheus.NewRegistry()
	agent.RegisterMetrics(reg, agent.StateSources{BrokerUp: pub.Connected, APIReachable: apiReachable, Journal: j})
	reports := reportapi.New(*cluster, *node, pub, workers, pub.BirthSeq, *queue, reg, log.WithName("reports"))
	reports.Counter = j
	reports.MaxConnections, reports.ReportRate, reports.ReportBurst = *reportConns, *reportRate, *reportBurst
	if *forwardTo != "" {
		reports.ForwardUnowned(*forwardTo, *queue)
	}
	events := make(chan struct{}, 1)
	edgeAgent, err = agent.New(agent.Config{Cluster: *cluster, Node: *node, Source: runtime, Workers: workers, Publisher: pub, Store: j,
		Actuator: agent.Actuators(source.ActuatorURL, runtime), Rebuilder: rebuilder, APIReachable: apiReachable, BrokerUp: pub.Connected,
		Timing: timing, Interval: *poll, Changed: events, Log: log.WithName("agent")})
	if err != nil {
		log.Error(err, "starting the agent")
		os.Exit(1)
	}

	published := make(chan struct{})
	go func() { pub.Run(ctx); close(published) }()
	go reports.Run(ctx)
	datasets := &reportapi.DatasetCounter{Cluster: *cluster, Node: *node, Sink: pub, Workers: workers.Workers, BirthSeq: pub.BirthSeq,
		Counter: j, HostRoot: *hostRoot, StateDir: *stateDir, MaxIndexBytes: *dsMaxBytes, CountTimeout: *dsCountLimit,
		Log: log.WithName("datasets")}
	go datasets.Run(ctx, *dsInterval)
	go workers.Run(ctx, time.Second)
	go edgeAgent.Run(ctx)
	go agent.FollowContainerEvents(ctx, runtime, events, log.WithName("events"))
	go agent.Heartbeats(ctx, *cluster, *node, *heartbeat, pub, apiReachable)
	if *metrics != "" {
		go func() {
			srv := &http.Server{Addr: *metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
			go func() { <-ctx.Done(); _ = srv.Close() }()
			if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
				log.Error(err, "serving metrics")
			}
		}()
	}
	log.Info("started", "version", version, "revision", revision, "broker", *broker, "reportAddress", *reportAddr, "criSocket", *socket)
	if err := reports.ListenAndServe(ctx, *reportAddr); err != nil {
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
