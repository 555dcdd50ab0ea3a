// Command lifeline-controller runs Lifeline's cloud controller: it reconciles JointInferenceServices and
// FederatedLearningJobs into their workers, and runs the MQTT broker the edge agents report to.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/brokertls"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	"github.com/lifeline-edge/lifeline/cmd/internal/flagcheck"
	"github.com/lifeline-edge/lifeline/cmd/internal/logflags"
	"github.com/lifeline-edge/lifeline/cmd/internal/memlimit"
	"github.com/lifeline-edge/lifeline/internal/certfile"
)

// version and revision are stamped at build time (make images: -ldflags -X main.version=... -X main.revision=...).
var (
	version  = "dev"
	revision = ""
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "release" {
		if err := release(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "lifeline-controller release:", err)
			os.Exit(1)
		}
		return
	}
	c := bindFlags(flag.CommandLine)
	flag.Parse()
	if c.showVersion {
		fmt.Println(versionLine("lifeline-controller"))
		return
	}
	if err := c.validate(flag.CommandLine); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(2)
	}
	opts := c.opts
	log, err := c.log.Logger(os.Stderr)
	if err != nil { // checked by validate
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(2)
	}
	// controller-runtime's and client-go's lines too: one format for the whole process.
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	ctrl.Log.Info("starting lifeline-controller", "version", version, "revision", revision)
	if soft, why, err := memlimit.Set(os.DirFS("/"), *c.memoryFraction); err != nil {
		ctrl.Log.Error(err, "no soft memory limit")
	} else {
		ctrl.Log.Info("soft memory limit", "bytes", soft, "from", why)
	}
	if err := mqttCredentials(&opts, c.tlsCert, c.tlsKey, c.caFile, c.passwordFile, c.clientCAFile, c.issue.CASecret != ""); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(1)
	}
	if err := scope(&opts, c.namespaces, c.selector); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(1)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller: loading kubeconfig:", err)
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if c.issue.CASecret != "" {
		if opts.MQTTTLS, err = issueBrokerCertificate(ctx, cfg, &c.issue); err != nil {
			fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
			os.Exit(1)
		}
	}
	if err := run(ctx, cfg, opts); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(1)
	}
}

// config is what the flags say, before the files they name are read.
type config struct {
	opts manager.Options
	// issue is the broker certificate's issuer, with --mqtt-tls-ca-secret.
	issue                                               brokertls.Issuer
	clientCAFile, tlsCert, tlsKey, passwordFile, caFile string
	namespaces, selector                                string
	memoryFraction                                      *float64
	log                                                 logflags.Options
	showVersion                                         bool
}

// bindFlags defines the controller's flags on fs; their values land in the config it returns once fs is parsed.
func bindFlags(fs *flag.FlagSet) *config {
	c := &config{}
	opts := &c.opts
	fs.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect one active replica through a Lease")
	fs.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader Lease (default: the pod's)")
	fs.StringVar(&opts.MetricsAddr, "metrics-bind-address", "127.0.0.1:8080",
		"address of the Prometheus metrics endpoint (plain HTTP unless --metrics-secure: then keep it on loopback); 0 disables it")
	fs.BoolVar(&opts.MetricsSecure, "metrics-secure", false,
		"serve the metrics over HTTPS to clients the API server authenticates (bearer token) and authorizes to get /metrics")
	fs.StringVar(&opts.HealthAddr, "health-probe-bind-address", ":8081",
		"address of /healthz (the manager runs) and /readyz (CRDs established, caches synced, the broker up); 0 disables them")
	fs.StringVar(&opts.PprofAddr, "pprof-bind-address", "", "address of Go's profiles under /debug/pprof/ (plain HTTP: keep it on loopback); empty disables them")
	fs.StringVar(&opts.LCServer, "lc-server", contract.DefaultLCServer, "LC_SERVER handed to edge workers: the node-local report endpoint")
	fs.StringVar(&opts.MQTTAddress, "mqtt-address", ":1883", "address of the embedded MQTT broker the edge agents connect to; empty disables edge awareness")
	fs.StringVar(&opts.MQTTCredentialsDir, "mqtt-credentials-dir", "/etc/lifeline/mqtt-credentials",
		"one file per edge node, named after it, holding its MQTT password (a mounted Secret)")
	fs.StringVar(&c.clientCAFile, "mqtt-client-ca-file", "",
		"KubeEdge's CA (PEM): the embedded broker's TLS listener admits a node by the certificate it signed, CN=system:node:<node>, O=system:nodes")
	fs.StringVar(&opts.MQTTRevokedCertificatesFile, "mqtt-revoked-certificates-file", "",
		"revoked node certificates' serial numbers, hex, one a line; read again when it changes")
	limits := broker.DefaultLimits()
	fs.IntVar(&opts.MQTTLimits.MaxConnections, "mqtt-max-connections", limits.MaxConnections,
		"authenticated MQTT sessions the embedded broker holds at once (connections still logging in have a budget of their own); "+
			"leave room above the number of edge nodes")
	fs.DurationVar(&opts.MQTTLimits.ConnectTimeout, "mqtt-connect-timeout", limits.ConnectTimeout,
		"a connection to the embedded broker that has not completed its MQTT CONNECT (TLS included) within this is closed")
	fs.Int("mqtt-max-retained-workers", 0, "deprecated and ignored: the embedded broker retains no message")
	fs.StringVar(&c.tlsCert, "mqtt-tls-cert", "", "certificate of the MQTT listener (PEM); with --mqtt-tls-key, the listener is TLS")
	fs.StringVar(&c.tlsKey, "mqtt-tls-key", "", "private key of the MQTT listener (PEM)")
	fs.StringVar(&c.issue.CASecret, "mqtt-tls-ca-secret", "",
		"instead of --mqtt-tls-cert: issue the MQTT listener's certificate from the CA in this Secret of --mqtt-tls-namespace, made there first if "+
			"there is none, and publish the CA to the agents in --mqtt-tls-ca-configmap; the certificate is renewed in memory")
	fs.StringVar(&c.issue.CAConfigMap, "mqtt-tls-ca-configmap", "lifeline-broker-ca", "with --mqtt-tls-ca-secret: the ConfigMap (key ca.crt) the agents read the CA from")
	fs.StringVar(&c.issue.Namespace, "mqtt-tls-namespace", "", "with --mqtt-tls-ca-secret: the namespace of that Secret and ConfigMap")
	fs.StringVar(&c.issue.CADir, "mqtt-tls-ca-dir", "",
		"with --mqtt-tls-ca-secret: where that Secret is mounted (an optional volume); the CA's key is read there, never through the API")
	fs.Func("mqtt-tls-names", "with --mqtt-tls-ca-secret: the broker's DNS names and IP addresses, comma-separated, which its certificate carries", func(v string) error {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				c.issue.Names = append(c.issue.Names, name)
			}
		}
		return nil
	})
	fs.StringVar(&opts.MQTTBrokerURL, "mqtt-broker-url", "", "use this external broker (tcp:// or ssl://) instead of the embedded one; it must enforce the nodes' ACL")
	fs.StringVar(&opts.MQTTUsername, "mqtt-username", "lifeline-controller", "user on the external broker")
	fs.StringVar(&c.passwordFile, "mqtt-password-file", "", "file holding the password on the external broker")
	fs.StringVar(&c.caFile, "mqtt-ca-file", "", "PEM certificates that sign the external broker's (default: the system's)")
	fs.StringVar(&opts.Cluster, "cluster", "default", "this cluster's name in the MQTT topic tree")
	fs.StringVar(&c.namespaces, "namespaces", "", "comma-separated namespaces whose workloads Lifeline reconciles; empty: all")
	fs.StringVar(&c.selector, "selector", "", "label selector of the JointInferenceServices and FederatedLearningJobs Lifeline reconciles; empty: all")
	fs.IntVar(&opts.ConcurrentReconciles, "concurrent-reconciles", manager.DefaultConcurrentReconciles,
		"JointInferenceServices, and FederatedLearningJobs, reconciled at once (never one twice)")
	fs.DurationVar(&opts.ReportStatusPeriod, "report-status-period", edgeaware.DefaultReportPeriod,
		"how long a workload's status write waits after its workers reported, so the reports meanwhile cost one write; 0: at once")
	c.memoryFraction = memlimit.FractionFlag(fs)
	logflags.Bind(fs, &c.log)
	fs.Func("zap-log-level", "deprecated: --log-level", func(v string) error { c.log.Level = v; return nil })
	fs.BoolVar(&c.showVersion, "version", false, "print the version and exit")
	return c
}

// flagRules are the controller's flags that must be positive beside its durations, and those where zero means
// something.
var flagRules = flagcheck.Rules{
	Counts: []string{"mqtt-max-connections", "concurrent-reconciles"},
	// --report-status-period=0 writes on each report; --memory-limit-fraction=0 sets no soft limit.
	ZeroOK: []string{"report-status-period", "memory-limit-fraction"},
}

// validate refuses, before anything starts, what the parsed flags of fs could only fail with later: a duration
// or a count that is not positive, an external broker URL that is not one.
func (c *config) validate(fs *flag.FlagSet) error {
	errs := []error{flagcheck.Check(fs, flagRules), c.log.Check()}
	if u := c.opts.MQTTBrokerURL; u != "" {
		errs = append(errs, flagcheck.BrokerURL("mqtt-broker-url", u))
	}
	if f := *c.memoryFraction; f > 1 {
		errs = append(errs, fmt.Errorf("--memory-limit-fraction must be at most 1, got %v", f))
	}
	if c.issue.CASecret != "" && c.opts.MQTTBrokerURL != "" {
		errs = append(errs, errors.New("--mqtt-tls-ca-secret issues the embedded broker's certificate: it has no use with --mqtt-broker-url"))
	}
	if c.issue.CASecret != "" && (c.tlsCert != "" || c.tlsKey != "") {
		errs = append(errs, errors.New("--mqtt-tls-ca-secret issues the listener's certificate: leave out --mqtt-tls-cert and --mqtt-tls-key"))
	}
	if c.issue.CASecret != "" && (c.issue.Namespace == "" || c.issue.CADir == "" || len(c.issue.Names) == 0) {
		errs = append(errs, errors.New("--mqtt-tls-ca-secret needs --mqtt-tls-namespace, --mqtt-tls-ca-dir and --mqtt-tls-names"))
	}
	return errors.Join(errs...)
}

// issueBrokerCertificate starts the issuer of the embedded listener's certificate (--mqtt-tls-ca-secret).
func issueBrokerCertificate(ctx context.Context, cfg *rest.Config, issuer *brokertls.Issuer) (*tls.Config, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	issuer.Client, issuer.Log = kube, ctrl.Log.WithName("broker-tls")
	if err := issuer.Start(ctx); err != nil {
		return nil, err
	}
	return &tls.Config{GetCertificate: issuer.GetCertificate, MinVersion: tls.VersionTLS12}, nil
}

// mqttCredentials loads the embedded listener's certificate (unless issued: the listener is TLS anyway) and the CA
// of the nodes' certificates, or the external broker's CA and password.
func mqttCredentials(opts *manager.Options, certFile, keyFile, caFile, passwordFile, clientCAFile string, issued bool) error {
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("reading the nodes' CA certificates from %s: %v", clientCAFile, err)
		}
		if certFile == "" && !issued {
			return fmt.Errorf("--mqtt-client-ca-file needs a TLS listener: set --mqtt-tls-cert and --mqtt-tls-key, or --mqtt-tls-ca-secret")
		}
		opts.MQTTClientCAs = pool
	}
	if certFile != "" || keyFile != "" {
		// Read again at each handshake once the files change: a renewed Secret (cert-manager, an operator) is
		// served without a restart.
		pair := &certfile.Pair{CertFile: certFile, KeyFile: keyFile}
		if err := pair.Load(); err != nil {
			return fmt.Errorf("loading the MQTT certificate: %w", err)
		}
		if pair.Current() == nil {
			return fmt.Errorf("loading the MQTT certificate: no %s and %s", certFile, keyFile)
		}
		opts.MQTTTLS = &tls.Config{GetCertificate: pair.GetCertificate, MinVersion: tls.VersionTLS12}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("reading the broker's CA certificates from %s: %v", caFile, err)
		}
		opts.MQTTTLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if passwordFile != "" {
		data, err := os.ReadFile(passwordFile)
		if err != nil {
			return fmt.Errorf("reading the MQTT password: %w", err)
		}
		opts.MQTTPassword = strings.TrimSpace(string(data))
	}
	return nil
}

// scope parses --namespaces and --selector.
func scope(opts *manager.Options, namespaces, selector string) error {
	for _, ns := range strings.Split(namespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			opts.Namespaces = append(opts.Namespaces, ns)
		}
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return fmt.Errorf("parsing --selector %q: %w", selector, err)
	}
	opts.Selector = sel
	return nil
}

// run builds the manager on cfg and runs it until ctx ends. The CRDs need not be established yet: the manager
// then waits for them, its readiness false, and starts the controllers once they are (manager.New).
func run(ctx context.Context, cfg *rest.Config, opts manager.Options) error {
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// release is the `release` subcommand, run before uninstalling Lifeline (a Helm pre-delete hook, or by hand once
// the controller is stopped): it removes Lifeline's accounting finalizer from every pod that carries it, and
// exits.
func release(args []string) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig to use (default: $KUBECONFIG, the in-cluster account, ~/.kube/config)")
	stop := fs.String("stop-deployment", "", "namespace/name of the controller's Deployment, scaled to zero first so no new worker gets the finalizer")
	stopTimeout := fs.Duration("stop-timeout", 2*time.Minute, "how long to wait for that Deployment's pods to end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagcheck.Check(fs, flagcheck.Rules{}); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}
	ctx := context.Background()
	if *stop != "" {
		ns, name, ok := strings.Cut(*stop, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--stop-deployment %q: want namespace/name", *stop)
		}
		if err := federatedlearning.StopDeployment(ctx, c, types.NamespacedName{Namespace: ns, Name: name}, *stopTimeout); err != nil {
			return err
		}
		fmt.Printf("stopped deployment %s\n", *stop)
	}
	n, err := federatedlearning.ReleaseFinalizers(ctx, c)
	fmt.Printf("released %d pods from %s\n", n, federatedlearning.WorkerFinalizer)
	return err
}

// versionLine is what --version prints: the command, its version and, when stamped, its commit.
func versionLine(command string) string {
	if revision == "" {
		return command + " " + version
	}
	return command + " " + version + " (revision " + revision + ")"
}
