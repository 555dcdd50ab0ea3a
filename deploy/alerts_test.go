package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// alertRules is the chart's PrometheusRule, rendered with values, as its rule groups and its rules by alert name.
func alertRules(t *testing.T, values ...string) (groups []any, rules map[string]map[string]any) {
	t.Helper()
	objs := renderChart(t, append([]string{"--set", "nodeIdentity.mode=password", "--set", "controller.metrics.prometheusRule.enabled=true"}, values...)...)
	rules = map[string]map[string]any{}
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		groups, _, _ = unstructured.NestedSlice(o.Object, "spec", "groups")
		for _, g := range groups {
			list, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
			for _, r := range list {
				rules[r.(map[string]any)["alert"].(string)] = r.(map[string]any)
			}
		}
	}
	if len(rules) == 0 {
		t.Fatal("no PrometheusRule rendered")
	}
	return groups, rules
}

// Each alert's runbook_url is its row in docs/operations.md's Alerts table, which says what to check and do.
func TestEveryAlertHasARunbookInTheDocs(t *testing.T) {
	_, rules := alertRules(t)
	docs, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range rules {
		url, _ := r["annotations"].(map[string]any)["runbook_url"].(string)
		anchor := strings.ToLower(name)
		if !strings.HasSuffix(url, "docs/operations.md#"+anchor) {
			t.Errorf("%s: runbook_url %q, want docs/operations.md#%s", name, url, anchor)
		}
		if !strings.Contains(string(docs), `<a id="`+anchor+`"></a>`) {
			t.Errorf("%s: docs/operations.md has no row with the anchor %s", name, anchor)
		}
	}
}

// firing is an alert promtool is to see at an evaluation time: its labels besides alertname, and its summary.
type firing struct {
	labels  map[string]string
	summary string
}

// alertCase is one promtool test of one alert: input series (promtool's notation) and what fires when.
type alertCase struct {
	name   string
	series map[string]string
	alert  string
	at     map[string][]firing // evaluation time -> what fires
}

// The rules as Prometheus evaluates them (Debian's promtool): each fires when and with what the Alerts table says,
// keeping the cluster label of a multi-cluster Prometheus, and not before its for: duration.
func TestAlertRulesFireAsDocumented(t *testing.T) {
	promtool := needTool(t, "promtool", "apt-get install prometheus")
	groups, rules := alertRules(t)
	const nodes = `lifeline_edge_nodes{cluster="eu",job="lifeline-controller-metrics",state="%s"}`
	edge := func(connected, cutOff, silent, never string) map[string]string {
		return map[string]string{
			strings.Replace(nodes, "%s", "connected", 1): connected, strings.Replace(nodes, "%s", "cut_off", 1): cutOff,
			strings.Replace(nodes, "%s", "silent", 1):                                          silent,
			`lifeline_edge_agents_never_heard{cluster="eu",job="lifeline-controller-metrics"}`: never,
			`up{cluster="eu",job="lifeline-controller-metrics"}`:                               "1x90",
		}
	}
	eu := func(severity string) map[string]string {
		return map[string]string{"cluster": "eu", "severity": severity}
	}
	cases := []alertCase{
		{"one node cut off for 10 min", edge("9x30", "1x30", "0x30", "0x30"), "LifelineEdgeNodesCutOff",
			map[string][]firing{"9m": nil, "11m": {{eu("warning"), "1 edge nodes cut off from the API server"}}}},
		{"one node of ten silent: an edge node's life", edge("9x30", "0x30", "1x30", "0x30"), "LifelineEdgeAgentsSilent",
			map[string][]firing{"20m": nil}},
		{"three of ten silent for 5 min", edge("7x30", "0x30", "3x30", "0x30"), "LifelineEdgeAgentsSilent",
			map[string][]firing{"4m": nil, "6m": {{eu("warning"), "30% of the edge agents silent"}}}},
		{"an agent never connected for 30 min", edge("9x40", "0x40", "0x40", "1x40"), "LifelineEdgeAgentsNeverConnected",
			map[string][]firing{"29m": nil, "31m": {{eu("warning"), "1 edge nodes whose agent never connected"}}}},
		{"a worker down on a cut-off node", map[string]string{`lifeline_edge_cut_off_workers_down{cluster="eu"}`: "0 0 2x20"},
			"LifelineWorkersDownOnCutOffNodes",
			map[string][]firing{"6m": nil, "8m": {{eu("critical"), "2 workers down on nodes cut off from the API server"}}}},
		{"a backlog that grows", map[string]string{`lifeline_edge_journal_reports{cluster="eu"}`: "900+100x60"},
			"LifelineEdgeJournalBacklog",
			map[string][]firing{"10m": nil, "30m": {{eu("warning"), "3900 agent messages wait in the journals of agents that are heard, and more each time"}}}},
		{"a backlog that drains", map[string]string{`lifeline_edge_journal_reports{cluster="eu"}`: "5000-50x60"},
			"LifelineEdgeJournalBacklog", map[string][]firing{"30m": nil}},
		{"the broker near its limit", map[string]string{`lifeline_broker_sessions{cluster="eu"}`: "950x20",
			`lifeline_broker_max_sessions{cluster="eu"}`: "1000x20"}, "LifelineBrokerNearSessionLimit",
			map[string][]firing{"9m": nil, "11m": {{eu("warning"), "The embedded broker holds 95% of the agents' sessions it admits"}}}},
		{"messages dropped", map[string]string{`lifeline_liveness_dropped_total{cluster="eu",reason="forged"}`: "0+60x40"},
			"LifelineMessagesDropped",
			map[string][]firing{"25m": {{eu("warning"), "The broker drops agents' messages or connections"}}}},
		{"the controller down", map[string]string{`up{cluster="eu",job="lifeline-controller-metrics"}`: "1 1 0x20"},
			"LifelineControllerDown", map[string][]firing{"3m": nil, "8m": {{eu("critical"), "No Lifeline controller scraped"}}}},
		{"no controller ever scraped", map[string]string{`lifeline_broker_sessions{cluster="eu"}`: "0x20"},
			"LifelineControllerDown", map[string][]firing{"3m": nil, "6m": {{map[string]string{"job": "lifeline-controller-metrics", "severity": "critical"}, "No Lifeline controller scraped"}}}},
	}

	var tests []any
	for _, c := range cases {
		var series []any
		for s, v := range c.series {
			series = append(series, map[string]any{"series": s, "values": v})
		}
		var evals []any
		annotations := rules[c.alert]["annotations"].(map[string]any)
		for at, fired := range c.at {
			var exp []any
			for _, f := range fired {
				exp = append(exp, map[string]any{"exp_labels": f.labels, "exp_annotations": map[string]any{"summary": f.summary,
					"description": annotations["description"], "runbook_url": annotations["runbook_url"]}})
			}
			evals = append(evals, map[string]any{"eval_time": at, "alertname": c.alert, "exp_alerts": exp})
		}
		tests = append(tests, map[string]any{"name": c.name, "interval": "1m", "input_series": series, "alert_rule_test": evals})
	}
	dir := t.TempDir()
	write := func(name string, v any) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("rules.yaml", map[string]any{"groups": groups})
	test := write("rules_test.yaml", map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": tests})
	if out, err := exec.Command(promtool, "test", "rules", test).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
	tested := map[string]bool{}
	for _, c := range cases {
		tested[c.alert] = true
	}
	for name := range rules {
		if !tested[name] {
			t.Errorf("alert %s has no promtool case", name)
		}
	}
}
