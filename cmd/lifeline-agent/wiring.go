package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lifeline-edge/lifeline/edge/agent"
	"github.com/lifeline-edge/lifeline/edge/agent/core"
	"github.com/lifeline-edge/lifeline/edge/cloudlink"
	"github.com/lifeline-edge/lifeline/edge/cri"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/health"
	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/edge/publisher"
	"github.com/lifeline-edge/lifeline/edge/reportapi"
	"github.com/lifeline-edge/lifeline/edge/standby"
	"github.com/lifeline-edge/lifeline/edge/standin"
	"github.com/lifeline-edge/lifeline/internal/listen"
)

// wiring is one run of the agent: its parts, assembled from the flags, then run together.
type wiring struct {
	o       *options
	log     logr.Logger
	journal *journal.Journal
	runtime *cri.Client
	// runtimeEvents wakes the agent when the runtime tells of a container's change.
	runtimeEvents chan struct{}

	// The watcher and the publisher log their retries at -v=2: the taps keep their latest error for the
	// first-failure lines and the readiness probe.
	podsErrors, brokerErrors agent.ErrorTap

	src  NodeSources
	word *desired.ControllerWord // the controller's word, when it is the pod source
	// refusedSets counts the controller's sets the word refused, by reason [P-DES-2].
	refusedSets *prometheus.CounterVec
	pub         *publisher.Publisher
	health      *health.Monitor
	agent       *agent.Agent
	reports     *reportapi.Server
	reg         *prometheus.Registry
}

// assemble builds the agent's parts; standbyProbe as runAgent's.
func (w *wiring) assemble(standbyProbe *cloudlink.Probe) error {
	o, log := w.o, w.log
	if err := w.podSources(standbyProbe); err != nil {
		return err
	}
	if err := w.publisher(); err != nil {
		return err
	}
	src, pub, j := w.src, w.pub, w.journal
	w.health = &health.Monitor{RuntimeAddress: o.socket, RuntimeFresh: health.RuntimeFreshness(o.poll),
		Broker: health.Session{Address: redacted(o.broker), Up: pub.Connected, Err: w.brokerErrors.Err},
		// The pod source answers (its watch, or a refusal), whether or not the cloud probe reaches the cloud: a
		// MetaServer answering a cut-off node is the edge working as it should.
		Pods:        health.Session{Address: src.PodSourceURL, Up: src.Workers.Reachable, Err: w.podsErrors.Err},
		HandingOver: standby.NodeLock{Dir: o.stateDir}.PodWaiting}
	w.health.Loop(health.LoopAgent, o.poll)
	w.health.Loop(health.LoopHeartbeats, o.heartbeat)
	timing := core.DefaultHealTiming
	timing.APIGrace, timing.DeadFor, timing.ControllerWait = o.healGrace, o.healDeadFor, o.healWait
	w.reg = prometheus.NewRegistry()
	w.refusedSets = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifeline_agent_desired_sets_refused_total",
		Help: "The controller's DesiredWorkers sets the agent refused, by reason: " + strings.Join(desired.RefusedSetReasons, ", ") + "."}, []string{"reason"})
	for _, reason := range desired.RefusedSetReasons {
		w.refusedSets.WithLabelValues(reason)
	}
	w.reg.MustRegister(w.refusedSets)
	health.RegisterMetrics(w.reg, health.StateSources{BrokerUp: pub.Connected, APIReachable: src.APIReachable, Journal: j,
		RuntimeUp: w.health.RuntimeAnswers, OfflineRebuilds: func() uint64 { return w.agent.OfflineRebuilds() }, Oversized: src.Workers.Oversized})
	w.reports = reportapi.New(o.cluster, o.node, pub, src.Workers, pub.BirthSeq, o.queue, w.reg, log.WithName("reports"))
	w.reports.Counter = j
	w.reports.MaxConnections, w.reports.ReportRate, w.reports.ReportBurst = o.reportConns, o.reportRate, o.reportBurst
	if o.forwardTo != "" {
		w.reports.ForwardUnowned(o.forwardTo, o.queue)
	}
	var err error
	w.agent, err = agent.New(agent.Config{Cluster: o.cluster, Node: o.node, Source: w.runtime, Workers: src.Workers, Publisher: pub, Store: j,
		Actuator: Actuators(src.ActuatorURL, w.runtime), Rebuilder: src.Rebuilder, APIReachable: src.APIReachable, BrokerUp: pub.Connected,
		Timing: timing, Interval: o.poll, Changed: w.runtimeEvents, Log: log.WithName("agent"), Probe: w.health.AgentLoop()})
	if err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	return nil
}

// podSources picks where the node's pods are read, and how the node learns it is cut off.
func (w *wiring) podSources(standbyProbe *cloudlink.Probe) error {
	o, log := w.o, w.log
	protected := ProtectedPaths(o.stateDir, o.socket, o.edgecoreConfig)
	gateBinary, err := o.gateBinary()
	if err != nil {
		return err
	}
	if standbyProbe != nil {
		w.src, err = StandbySources(o.node, o.stateDir, o.staticDir, gateBinary, protected, standbyProbe,
			w.podsErrors.Logger(log.WithName("desired")))
	} else {
		flags := PodSourceFlags{InCluster: o.inCluster, Kubeconfig: o.kubeconfig,
			APIServer: o.apiServer, APIServerExplicit: o.explicit["api-server"], EdgecoreConfig: o.edgecoreConfig,
			MetaServer: o.metaServer, MetaServerExplicit: o.explicit["metaserver"], CloudProbe: o.cloudProbe, CloudProbeCA: o.cloudProbeCA,
			StaticDir: o.staticDir, AllowInsecurePods: o.insecurePods,
			InsecureHostPaths: o.insecureHostPaths, HostRoot: o.hostRoot, GateBinary: gateBinary}
		if flags.UsesControllerWord(o.podSource) {
			w.word = &desired.ControllerWord{Node: o.node, OverTLS: strings.HasPrefix(o.broker, "ssl://"),
				Session: func() (uint64, bool) { return w.pub.BirthSeq(), w.pub.Connected() }}
			flags.Word = w.word
		}
		w.src, err = PodSources(o.node, o.stateDir, protected, flags, log, w.podsErrors.Logger(log.WithName("desired")))
	}
	if err == nil && w.src.RunProbe {
		w.src.Probe.Period, w.src.Probe.Timeout = o.probePeriod, o.probeTimeout
	}
	if pods, ok := w.src.Rebuilder.(*standin.StaticPods); ok {
		pods.Node, pods.Runtime = o.node, w.runtime
	}
	return err
}

// gateBinary is the binary armed stand-ins run as their gate: this one, with --arm-stand-ins; none without.
func (o *options) gateBinary() (string, error) {
	if !o.armStandIns {
		return "", nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the agent's binary, which armed stand-ins run as their gate: %w", err)
	}
	return self, nil
}

// publisher builds the MQTT publisher, whose commands go to the agent.
func (w *wiring) publisher() error {
	o := w.o
	password, err := publisher.Password(o.passFile)
	if err != nil {
		return err
	}
	tlsConfig, err := publisher.TLSConfig(o.caFile, o.certFile, o.keyFile, w.log)
	if err != nil {
		return err
	}
	cfg := publisher.Config{Broker: o.broker, Username: o.username, Password: password, TLS: tlsConfig,
		Cluster: o.cluster, Node: o.node, AgentVersion: version, MaxRetryInterval: o.retryMax, HeartbeatInterval: o.heartbeat,
		APIReachable: func() (bool, bool) { return w.src.APIReachable(), w.src.APIKnown() }, BootID: publisher.BootID(), StateDir: o.stateDir,
		Log: w.brokerErrors.Logger(w.log.WithName("publisher")), OnCommand: func(payload []byte) { w.agent.HandleCommand(payload) }}
	if w.word != nil { // subscribed only by an agent that reads it
		cfg.OnDesired = w.takeDesired
	}
	w.pub = publisher.New(cfg, w.journal)
	return nil
}

// takeDesired hands the controller's set to the pod source that reads it.
func (w *wiring) takeDesired(birthSeq uint64, payload []byte) {
	err := w.word.Offer(birthSeq, payload)
	var refused *desired.RefusedSetError
	if errors.As(err, &refused) {
		w.refusedSets.WithLabelValues(refused.Reason).Inc()
		w.log.Error(err, "refused the controller's desired workers", "birthSeq", birthSeq)
	}
}

// run runs every loop and the report API until ctx ends, then waits for the loops and the publisher's death
// message.
func (w *wiring) run(ctx context.Context) error {
	o, log, src, pub := w.o, w.log, w.src, w.pub
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var loops sync.WaitGroup
	var probeChanges <-chan struct{}
	if src.Probe != nil {
		probeChanges = src.Probe.Changes()
	}
	if src.RunProbe {
		loops.Go(func() { src.Probe.Run(ctx) })
	}
	published := make(chan struct{})
	go func() { pub.Run(ctx); close(published) }()
	// The report API stops last: while the rest stops (the publisher's death message, the loops) the workers'
	// reports are still taken and journaled, so that an agent handing the node over is away from them only
	// between its release of the node and the next agent's start.
	serving, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	queued := make(chan struct{})
	go func() { w.reports.Run(serving); close(queued) }()
	datasets := &reportapi.DatasetCounter{Cluster: o.cluster, Node: o.node, Sink: pub, Workers: src.Workers.Workers, BirthSeq: pub.BirthSeq,
		Counter: w.journal, HostRoot: o.hostRoot, StateDir: o.stateDir, MaxIndexBytes: o.dsMaxBytes, CountTimeout: o.dsCountLimit,
		Log: log.WithName("datasets")}
	loops.Go(func() { datasets.Run(ctx, o.dsInterval) })
	loops.Go(func() { src.Workers.Run(ctx, time.Second) })
	loops.Go(func() { w.agent.Run(ctx) })
	loops.Go(func() { FollowContainerEvents(ctx, w.runtime, w.runtimeEvents, log.WithName("events")) })
	loops.Go(func() {
		agent.Heartbeats(ctx, o.cluster, o.node, o.heartbeat, w.health.Heartbeats(pub),
			agent.HeartbeatFacts{APIReachable: src.APIReachable, Journaled: w.journal.LogEntries, Oversized: src.Workers.Oversized,
				Changed: probeChanges})
	})
	loops.Go(func() { w.health.Run(ctx, log.WithName("health")) })
	// A port another process holds is tried again until the agent gets it (listen.WhenFree): exiting would only
	// crash-loop the agent, and leave the port to the other process.
	if o.healthAddr != "" {
		loops.Go(func() {
			if ln := listen.WhenFree(ctx, o.healthAddr, "the probes (--health-address)", log); ln != nil {
				serve(ctx, ln, w.health.Handler(), log.WithName("health"))
			}
		})
	}
	if o.metrics != "" {
		loops.Go(func() {
			if ln := listen.WhenFree(ctx, o.metrics, "the metrics (--metrics-address)", log); ln != nil {
				serve(ctx, ln, promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{}), log.WithName("metrics"))
			}
		})
	}
	log.Info("started", "version", version, "revision", revision, "broker", redacted(o.broker), "reportAddress", o.reportAddr,
		"criSocket", o.socket, "podSource", src.PodSourceURL, "healthAddress", o.healthAddr)
	served := make(chan error, 1)
	go func() { served <- w.reports.ListenAndServe(serving, o.reportAddr) }()
	var err error
	select {
	case err = <-served: // its address does not parse
		cancel()
	case <-ctx.Done():
	}
	// The publisher ends with its own death message [P-DEATH-1].
	select {
	case <-published:
	case <-time.After(5 * time.Second):
	}
	loops.Wait()
	stopServing()
	if err == nil {
		err = <-served
	}
	<-queued
	if err != nil {
		return fmt.Errorf("report API: %w", err)
	}
	return nil
}
