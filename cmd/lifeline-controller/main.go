// Command lifeline-controller runs Lifeline's cloud controller: it reconciles JointInferenceServices and
// FederatedLearningJobs into their workers, and runs the MQTT broker the edge agents report to.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	"github.com/lifeline-edge/lifeline/cloud/manager"
)

func main() {
	var opts manager.Options
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect one active replica through a Lease")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader Lease (default: the pod's)")
	flag.StringVar(&opts.MetricsAddr, "metrics-bind-address", "127.0.0.1:8080", "address of the Prometheus metrics endpoint (plain HTTP: keep it on loopback); 0 disables it")
	flag.StringVar(&opts.HealthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 disables them")
	flag.StringVar(&opts.LCServer, "lc-server", contract.DefaultLCServer, "LC_SERVER handed to edge workers: the node-local report endpoint")
	flag.StringVar(&opts.MQTTAddress, "mqtt-address", ":1883", "address of the embedded MQTT broker the edge agents connect to; empty disables edge awareness")
	flag.StringVar(&opts.MQTTCredentialsDir, "mqtt-credentials-dir", "/etc/lifeline/mqtt-credentials",
		"one file per edge node, named after it, holding its MQTT password (a mounted Secret)")
	limits := broker.DefaultLimits()
	flag.IntVar(&opts.MQTTLimits.MaxConnections, "mqtt-max-connections", limits.MaxConnections,
		"TCP connections the embedded broker holds at once, authenticated or not; leave room above the number of edge nodes")
	flag.DurationVar(&opts.MQTTLimits.ConnectTimeout, "mqtt-connect-timeout", limits.ConnectTimeout,
		"a connection to the embedded broker that has not completed its MQTT CONNECT (TLS included) within this is closed")
	flag.IntVar(&opts.MQTTLimits.MaxRetainedWorkers, "mqtt-max-retained-workers", limits.MaxRetainedWorkers,
		"worker-state topics one edge node may have retained on the embedded broker; further ones are delivered, not retained")
	tlsCert := flag.String("mqtt-tls-cert", "", "certificate of the MQTT listener (PEM); with --mqtt-tls-key, the listener is TLS")
	tlsKey := flag.String("mqtt-tls-key", "", "private key of the MQTT listener (PEM)")
	flag.StringVar(&opts.MQTTBrokerURL, "mqtt-broker-url", "", "use this external broker (tcp:// or ssl://) instead of the embedded one; it must enforce the nodes' ACL")
	flag.StringVar(&opts.MQTTUsername, "mqtt-username", "lifeline-controller", "user on the external broker")
	passwordFile := flag.String("mqtt-password-file", "", "file holding the password on the external broker")
	caFile := flag.String("mqtt-ca-file", "", "PEM certificates that sign the external broker's (default: the system's)")
	flag.StringVar(&opts.Cluster, "cluster", "default", "this cluster's name in the MQTT topic tree")
	namespaces := flag.String("namespaces", "", "comma-separated namespaces whose workloads Lifeline reconciles; empty: all")
	selector := flag.String("selector", "", "label selector of the JointInferenceServices and FederatedLearningJobs Lifeline reconciles; empty: all")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := mqttCredentials(&opts, *tlsCert, *tlsKey, *caFile, *passwordFile); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(1)
	}
	if err := scope(&opts, *namespaces, *selector); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(1)
	}

	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-controller:", err)
		os.Exit(1)
	}
}

// mqttCredentials loads the embedded listener's certificate, or the external broker's CA and password.
func mqttCredentials(opts *manager.Options, certFile, keyFile, caFile, passwordFile string) error {
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return fmt.Errorf("loading the MQTT certificate: %w", err)
		}
		opts.MQTTTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
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

func run(opts manager.Options) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
