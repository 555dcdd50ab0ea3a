// Command kubectl-lifeline is a kubectl plugin (`kubectl lifeline ...`) showing the edge as Lifeline sees it: each
// edge node's agent and the liveness of its workers, and every worker with where its status comes from. It reads
// only the API server (Nodes' LifelineAgent condition, JointInferenceServices' and FederatedLearningJobs' status)
// with the user's own kubeconfig and rights.
//
//	kubectl lifeline nodes [--watch] [-o wide|json|yaml]
//	kubectl lifeline workers [ji|fl NAME] [-n NAMESPACE | -A] [--watch] [-o wide|json|yaml]
//
// --kubeconfig and --context choose the cluster as kubectl's do.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/edgeaware"
	"github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/cloud/jointinference"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
)

const usage = `usage: kubectl lifeline nodes|workers [flags]
  nodes                     every edge node: its Lifeline agent, whether it reaches the API server, its workers
  workers [ji|fl NAME]      every worker (of one JointInferenceService or FederatedLearningJob): liveness, source
flags:`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kubectl lifeline:", err)
		os.Exit(1)
	}
}

// run carries out one invocation; kube is the client to use (nil: from the kubeconfig the flags name).
func run(ctx context.Context, args []string, out io.Writer, kube client.Client) error {
	fs := flag.NewFlagSet("kubectl lifeline", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), usage); fs.PrintDefaults() }
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
	kubeContext := fs.String("context", "", "the kubeconfig's context to use (default: its current context)")
	namespace := fs.String("namespace", "", "only this namespace's workloads (default: every namespace you may list)")
	fs.StringVar(namespace, "n", "", "short for --namespace")
	allNamespaces := fs.Bool("all-namespaces", false, "every namespace's workloads you may list (the default; overrides --namespace)")
	fs.BoolVar(allNamespaces, "A", false, "short for --all-namespaces")
	output := fs.String("output", "", "the output format: empty or wide for a table (every column either way), json or yaml")
	fs.StringVar(output, "o", "", "short for --output")
	watch := fs.Bool("watch", false, "redraw in place as things change, until Ctrl-C")
	fs.BoolVar(watch, "w", false, "short for --watch")
	interval := fs.Duration("interval", time.Second, "how often --watch reads again")
	view, rest := "", []string{}
	// Flags may come before or after the view's words, as with kubectl.
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(rest) > 0 {
		view, rest = rest[0], rest[1:]
	}
	var kind, name string
	switch {
	case view == "nodes" && len(rest) == 0:
	case view == "workers" && len(rest) == 0:
	case view == "workers" && len(rest) == 2 && (rest[0] == "ji" || rest[0] == "fl"):
		kind, name = rest[0], rest[1]
	default:
		fs.Usage()
		return fmt.Errorf("unknown view %q", strings.Join(append([]string{view}, rest...), " "))
	}
	if *interval <= 0 {
		return fmt.Errorf("--interval must be positive, got %v", *interval)
	}
	write := map[string]func(io.Writer, [][]string) error{"": printTable, "wide": printTable, "json": printJSON, "yaml": printYAML}[*output]
	if write == nil {
		return fmt.Errorf("--output %q: want wide, json or yaml, or none for a table", *output)
	}
	document := *output == "json" || *output == "yaml"
	if *allNamespaces {
		*namespace = ""
	}
	if kube == nil {
		var err error
		if kube, err = newClient(*kubeconfig, *kubeContext); err != nil {
			return err
		}
	}
	draw := func() error {
		f, err := read(ctx, kube, *namespace, view == "nodes", kind, name)
		if err != nil {
			return err
		}
		table := workerTable
		if view == "nodes" {
			table = nodeTable
		}
		return write(out, table(f, time.Now()))
	}
	if !*watch {
		return draw()
	}
	header := "" // a JSON or YAML document a frame, nothing between them
	if !document {
		header = "kubectl lifeline " + strings.Join(append([]string{view}, rest...), " ")
	}
	return watchFrames(ctx, out, *interval, header, draw)
}

// watchFrames draws a frame every interval until ctx ends, each under header (with the time) unless it is empty:
// in place on a terminal, one after the other elsewhere.
func watchFrames(ctx context.Context, out io.Writer, interval time.Duration, header string, draw func() error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	redraw := isTerminal(out)
	for {
		if redraw {
			fmt.Fprint(out, "\033[H\033[2J") // home and clear: redraw in place
		}
		if header != "" {
			fmt.Fprintf(out, "Every %v: %s    %s\n\n", interval, header, time.Now().Format(time.TimeOnly))
		}
		if err := draw(); err != nil {
			fmt.Fprintln(out, "error:", err) // a watch outlives a failed read: the link may come back
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// isTerminal tells whether out is a terminal: --watch redraws in place there, and elsewhere (a pipe, a file)
// writes each frame after the last, with no control sequence.
func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newClient is a client of the API server the kubeconfig and its context name, as kubectl's own loading rules
// find them.
func newClient(kubeconfig, kubeContext string) (client.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// read reads what a view draws: the edge Nodes (for nodes) and the workloads (all, or kind/name).
func read(ctx context.Context, kube client.Client, namespace string, withNodes bool, kind, name string) (fleet, error) {
	var f fleet
	if withNodes {
		nodes := &corev1.NodeList{}
		if err := kube.List(ctx, nodes, client.HasLabels{nodecondition.EdgeNodeLabel}); err != nil {
			return f, fmt.Errorf("listing edge nodes: %w", err)
		}
		f.nodes = nodes.Items
		f.heals = readHeals(ctx, kube, namespace)
	}
	in := []client.ListOption{}
	if namespace != "" {
		in = append(in, client.InNamespace(namespace))
	}
	if kind != "fl" {
		jis := &v1alpha1.JointInferenceServiceList{}
		if err := kube.List(ctx, jis, in...); err != nil {
			return f, fmt.Errorf("listing JointInferenceServices: %w", err)
		}
		for _, ji := range jis.Items {
			if name == "" || ji.Name == name {
				f.workloads = append(f.workloads, workload{kind: jointinference.Kind, namespace: ji.Namespace, name: ji.Name, workers: ji.Status.Workers})
			}
		}
	}
	if kind != "ji" {
		jobs := &v1alpha1.FederatedLearningJobList{}
		if err := kube.List(ctx, jobs, in...); err != nil {
			return f, fmt.Errorf("listing FederatedLearningJobs: %w", err)
		}
		for _, job := range jobs.Items {
			if name == "" || job.Name == name {
				f.workloads = append(f.workloads, workload{kind: federatedlearning.Kind, namespace: job.Namespace, name: job.Name, workers: job.Status.Workers})
			}
		}
	}
	if name != "" && len(f.workloads) == 0 {
		return f, fmt.Errorf("no %s %q", map[string]string{"ji": jointinference.Kind, "fl": federatedlearning.Kind}[kind], name)
	}
	return f, nil
}

// readHeals counts, per node, the workers its agent healed as the Events tell (RestartedByAgent on the
// controller's command, RestartedOffline by the offline policy), for as long as the API server keeps Events (an
// hour by default). Nil when the user may not list Events: the view shows the rest.
func readHeals(ctx context.Context, kube client.Client, namespace string) map[string]int {
	heals := map[string]int{}
	for _, reason := range []string{edgeaware.ReasonRestartedByAgent, edgeaware.ReasonRestartedOffline} {
		events := &eventsv1.EventList{}
		opts := []client.ListOption{client.MatchingFields{"reason": reason}}
		if namespace != "" {
			opts = append(opts, client.InNamespace(namespace))
		}
		if err := kube.List(ctx, events, opts...); err != nil {
			return nil
		}
		for _, e := range events.Items {
			if e.Related == nil || e.Related.Kind != "Node" || e.Reason != reason {
				continue
			}
			n := 1
			if e.Series != nil && e.Series.Count > 1 {
				n = int(e.Series.Count)
			} else if e.DeprecatedCount > 1 {
				n = int(e.DeprecatedCount)
			}
			heals[e.Related.Name] += n
		}
	}
	return heals
}
