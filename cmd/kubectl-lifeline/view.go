package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/nodecondition"
)

// workload is a JointInferenceService or a FederatedLearningJob, as the views need it.
type workload struct {
	kind, namespace, name string
	workers               []v1alpha1.WorkerStatus
}

// fleet is what the views are drawn from: everything read from the API server, with the user's rights.
type fleet struct {
	nodes     []corev1.Node // edge nodes
	workloads []workload
	// heals counts the workers each node's agent healed, from the Events; nil when they could not be read.
	heals map[string]int
}

// nodeTable is one line per edge node: its agent's condition, and its workers by liveness.
func nodeTable(f fleet, now time.Time) [][]string {
	type counts struct{ alive, dead, unknown, agent int }
	byNode := map[string]*counts{}
	for _, wl := range f.workloads {
		for _, w := range wl.workers {
			c := byNode[w.Node]
			if c == nil {
				c = &counts{}
				byNode[w.Node] = c
			}
			switch w.Liveness {
			case v1alpha1.LivenessAlive:
				c.alive++
			case v1alpha1.LivenessDead:
				c.dead++
			default:
				c.unknown++
			}
			if w.Source == v1alpha1.StatusSourceAgent {
				c.agent++
			}
		}
	}
	rows := [][]string{{"NODE", "AGENT", "API SERVER", "SINCE", "ALIVE", "DEAD", "UNKNOWN", "IN THE AGENT'S WORD", "HEALED BY AGENT"}}
	nodes := append([]corev1.Node(nil), f.nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	for _, n := range nodes {
		agent, api, since := "never-heard", "?", "-"
		if cond := agentCondition(n); cond != nil {
			agent, api = agentWords(cond.Reason)
			since = age(cond.LastTransitionTime.Time, now)
		}
		c := byNode[n.Name]
		if c == nil {
			c = &counts{}
		}
		healed := "?"
		if f.heals != nil {
			healed = fmt.Sprint(f.heals[n.Name])
		}
		rows = append(rows, []string{n.Name, agent, api, since, fmt.Sprint(c.alive), fmt.Sprint(c.dead), fmt.Sprint(c.unknown),
			fmt.Sprint(c.agent), healed})
	}
	return rows
}

// agentWords says a LifelineAgent reason as the agent's state and the node's reach of the API server.
func agentWords(reason string) (agent, api string) {
	switch reason {
	case nodecondition.ReasonConnected:
		return "heard", "reachable"
	case nodecondition.ReasonAPIServerUnreachable:
		return "heard", "UNREACHABLE"
	case nodecondition.ReasonSilent:
		return "SILENT", "?"
	case nodecondition.ReasonStopped:
		return "STOPPED", "?"
	}
	return "never-heard", "?"
}

func agentCondition(n corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == nodecondition.Type {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// workerTable is one line per worker of the workloads, by namespace, workload and worker.
func workerTable(f fleet, now time.Time) [][]string {
	rows := [][]string{{"NAMESPACE", "WORKLOAD", "WORKER", "ROLE", "NODE", "LIVENESS", "PHASE", "SOURCE", "RESTARTS", "LAST SEEN"}}
	wls := append([]workload(nil), f.workloads...)
	sort.Slice(wls, func(i, j int) bool {
		return wls[i].namespace+"/"+wls[i].kind+"/"+wls[i].name < wls[j].namespace+"/"+wls[j].kind+"/"+wls[j].name
	})
	for _, wl := range wls {
		workers := append([]v1alpha1.WorkerStatus(nil), wl.workers...)
		sort.Slice(workers, func(i, j int) bool { return workers[i].Name < workers[j].Name })
		for _, w := range workers {
			seen := "-"
			if w.LastSeen != nil {
				seen = age(w.LastSeen.Time, now)
			}
			rows = append(rows, []string{wl.namespace, wl.kind + "/" + wl.name, w.Name, string(w.Role), orDash(w.Node),
				orDash(string(w.Liveness)), orDash(w.Phase), orDash(string(w.Source)), fmt.Sprint(w.Restarts), seen})
		}
	}
	return rows
}

// printTable writes rows in aligned columns, as kubectl get does, each cell printable (printable): some are what
// a node wrote (a pod's phase), and a control sequence in one would reach the admin's terminal. No value holds a
// space, so that awk and cut split the lines into the columns.
func printTable(out io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	for n, r := range rows {
		cells := make([]string, len(r))
		for i, cell := range r {
			cells[i] = printable(cell)
			if n > 0 {
				cells[i] = strings.ReplaceAll(cells[i], " ", "_")
			}
		}
		if _, err := fmt.Fprintln(tw, strings.Join(cells, "\t")); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// printable is s with every control character (ESC, BEL, the C1 controls, a tab or a newline that would break
// the columns) and every bidirectional override written as a Go escape, so that it prints as text.
func printable(s string) string {
	if !strings.ContainsFunc(s, unprintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unprintable(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func unprintable(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// printJSON writes rows as kubectl's -o json writes a list: {"items": [...]}, each row an object keyed by its
// column's header in lowerCamelCase ("API SERVER" is "apiServer").
func printJSON(out io.Writer, rows [][]string) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "    ")
	return enc.Encode(items(rows))
}

// printYAML writes rows as printJSON does, in YAML, as one document of a stream (--watch writes several).
func printYAML(out io.Writer, rows [][]string) error {
	data, err := yaml.Marshal(items(rows))
	if err != nil {
		return err
	}
	_, err = out.Write(append([]byte("---\n"), data...))
	return err
}

// items is rows as a list of objects, each keyed by its column's header in lowerCamelCase.
func items(rows [][]string) map[string]any {
	keys := make([]string, len(rows[0]))
	for i, header := range rows[0] {
		words := strings.Fields(strings.ToLower(strings.ReplaceAll(header, "'", "")))
		for j := 1; j < len(words); j++ {
			words[j] = strings.ToUpper(words[j][:1]) + words[j][1:]
		}
		keys[i] = strings.Join(words, "")
	}
	items := make([]map[string]string, 0, len(rows)-1)
	for _, r := range rows[1:] {
		item := make(map[string]string, len(r))
		for i, cell := range r {
			item[keys[i]] = printable(cell) // JSON and YAML leave C1 controls and bidi overrides as they are
		}
		items = append(items, item)
	}
	return map[string]any{"items": items}
}

func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
